"""Tiny random Hugging Face checkpoints: our loader + decoder against transformers' own forward pass.

These exercise the model code paths the real GGUF files do not: untied heads, several KV heads per
group, Gemma 3's sliding window on short sequences, Qwen2's q/k/v biases (tied and untied), Qwen3's per-head
q/k norms with an explicit head_dim (and its sliding layers), Mistral's sliding window (8 tokens, shorter
than the 40-token prompt and the 12 + 16 tokens of greedy decoding), bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specrag_jax.models.executor.runner import Chunk, ModelRunner  # noqa: E402
from specrag_jax.models.generation import greedy_generate  # noqa: E402
from specrag_jax.models.loading.load import load_model_params  # noqa: E402


def make_llama(tmp_path, tie: bool):
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-5,
    )
    return cfg, transformers.LlamaForCausalLM(cfg)


def make_qwen2(tmp_path, tie: bool):
    cfg = transformers.Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=1e6,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
        use_sliding_window=False,
    )
    return cfg, transformers.Qwen2ForCausalLM(cfg)


def make_qwen3(tmp_path, tie: bool, sliding: bool = False):
    cfg = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=256,
        rope_theta=1e6,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
        use_sliding_window=sliding,
        sliding_window=8,
        max_window_layers=1,
    )
    return cfg, transformers.Qwen3ForCausalLM(cfg)


def make_mistral(tmp_path, tie: bool):
    cfg = transformers.MistralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=1e6,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-5,
        sliding_window=8,
    )
    return cfg, transformers.MistralForCausalLM(cfg)


def make_gemma3(tmp_path, tie: bool = True):
    cfg = transformers.Gemma3TextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        query_pre_attn_scalar=24,
        rope_theta=1e6,
        rope_local_base_freq=10000.0,
        rms_norm_eps=1e-6,
    )
    return cfg, transformers.Gemma3ForCausalLM(cfg)


def build(tmp_path, family: str, tie: bool):
    torch.manual_seed(0)
    makers = {
        "gemma3": make_gemma3,
        "qwen2": make_qwen2,
        "llama": make_llama,
        "qwen3": make_qwen3,
        "qwen3-sliding": lambda d, t: make_qwen3(d, t, sliding=True),
        "mistral": make_mistral,
    }
    _, model = makers[family](tmp_path, tie)
    with torch.no_grad():  # norms start at 0/1 and biases at 0: randomise so they matter
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
    model.eval().save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize(
    "family, tie",
    [
        ("llama", False),
        ("llama", True),
        ("qwen2", False),
        ("qwen2", True),
        ("gemma3", True),
        ("qwen3", False),
        ("qwen3", True),
        ("qwen3-sliding", False),
        ("mistral", False),
        ("mistral", True),
    ],
)
def test_logits_match_transformers(tmp_path, family, tie):
    theirs = build(tmp_path, family, tie)
    cfg, params = load_model_params(str(tmp_path), cache=False)
    runner = ModelRunner(cfg, params, num_pages=32, page_size=4, max_seq_len=64)
    ids = list(np.random.default_rng(1).integers(0, 128, size=40))
    pages = runner.allocator.allocate(10)
    mine = runner.logits(runner.pack([Chunk(pages, 0, ids, rows=list(range(40)))]))
    with torch.no_grad():
        ref = theirs(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(mine - ref).max() <= 1e-4, np.abs(mine - ref).max()
    if family == "qwen2":
        assert cfg.attention_bias and np.abs(np.asarray(params["layers"]["attn"]["q"]["bias"])).max() > 0
    if family.startswith("qwen3"):
        assert cfg.qk_norm and not cfg.attention_bias and cfg.head_dim == 24
        assert cfg.layer_windows() == ([0, 8, 8] if family == "qwen3-sliding" else [0, 0, 0])
    if family == "mistral":
        assert cfg.layer_windows() == [8, 8, 8] and cfg.layer_rope_thetas() == [1e6] * 3
    if family in ("mistral", "qwen3-sliding"):  # the window matters: without it the logits part from theirs
        unwindowed = ModelRunner(
            cfg.replace(sliding_window=None, layer_types=()), params, num_pages=32, page_size=4, max_seq_len=64
        )
        step = unwindowed.pack([Chunk(unwindowed.allocator.allocate(10), 0, ids, rows=list(range(40)))])
        assert np.abs(unwindowed.logits(step) - ref).max() > 0.1

    # Greedy decoding through the paged cache equals transformers' cached greedy decoding.
    prompt = ids[:12]
    runner.allocator.release(pages)
    ours = greedy_generate(runner, [prompt], 16)[0]
    with torch.no_grad():
        out = theirs.generate(
            torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert ours == out[0, 12:].tolist()


def test_bfloat16_tracks_float32(tmp_path):
    build(tmp_path, "gemma3", True)
    logits = {}
    for dtype in ("float32", "bfloat16"):
        cfg, params = load_model_params(str(tmp_path), dtype=dtype, cache=False)
        runner = ModelRunner(cfg, params, num_pages=32, page_size=4, max_seq_len=64)
        assert str(runner.pool.k[0].dtype) == dtype
        ids = list(range(3, 35))
        pages = runner.allocator.allocate(8)
        logits[dtype] = runner.logits(runner.pack([Chunk(pages, 0, ids, rows=list(range(32)))]))
    diff = np.abs(logits["float32"] - logits["bfloat16"]).max()
    scale = np.abs(logits["float32"]).max()
    assert diff <= 0.05 * scale
