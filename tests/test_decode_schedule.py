"""benchmarks/decode_schedule.py: the prompts it cuts have the workload's lengths and differ from one another."""

from benchmarks.decode_schedule import WORKLOADS, prompts_of


class CharTokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text[:500]]  # shorter than the longest prompt: the text is repeated


def test_prompts_have_the_workload_lengths():
    for lens in WORKLOADS.values():
        prompts = prompts_of(CharTokenizer(), lens)
        assert [len(p) for p in prompts] == lens
        assert len({tuple(p[:50]) for p in prompts}) == len(prompts)  # cut at different offsets
