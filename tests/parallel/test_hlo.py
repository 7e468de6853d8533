"""Reading collectives out of compiled HLO text."""

from specrag_jax.parallel.hlo import collective_stats

HLO = """
  %all-reduce.1 = f32[16,640]{1,0} all-reduce(f32[16,640]{1,0} %dot), channel_id=1, replica_groups={{0,1}}
  %all-gather-start = (f32[4,8]{1,0}, f32[16,8]{1,0}) all-gather-start(f32[4,8]{1,0} %p), dimensions={0}
  %all-gather-done = f32[16,8]{1,0} all-gather-done((f32[4,8]{1,0}, f32[16,8]{1,0}) %all-gather-start)
  %rs = bf16[2,4]{1,0} reduce-scatter(bf16[8,4]{1,0} %x), dimensions={0}
  %ar2 = (f32[2]{0}, s32[3]{0}) all-reduce(f32[2]{0} %a, s32[3]{0} %b), to_apply=%add
  %add.3 = f32[16,640]{1,0} add(f32[16,640]{1,0} %all-reduce.1, f32[16,640]{1,0} %y)
"""


def test_collective_stats_counts_and_bytes():
    s = collective_stats(HLO)
    assert s["all-reduce"] == {"count": 2, "bytes": 16 * 640 * 4 + 2 * 4 + 3 * 4}
    assert s["all-gather"] == {"count": 1, "bytes": 16 * 8 * 4}
    assert s["reduce-scatter"] == {"count": 1, "bytes": 2 * 4 * 2}
    assert s["all-to-all"]["count"] == 0 and s["collective-permute"]["count"] == 0
    assert s["total"]["count"] == 4
