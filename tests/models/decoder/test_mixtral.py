"""Mixtral (sparse MoE) against transformers on tiny random checkpoints: logits, routing on every token, greedy
decoding through the paged cache, bfloat16; GGUF (stacked and per-expert experts) from the same weights; bad input."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.decoder.transformer import Decoder
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.generation import greedy_generate
from specrag_jax.models.loading.gguf_loader import GGUF_MOE_LEGACY_NAMES, GGUF_MOE_NAMES, GGUF_NAMES, load_gguf
from specrag_jax.models.loading.hf_loader import HF_NAMES, load_hf
from specrag_jax.models.loading.load import load_model_params
from specrag_jax.models.loading.params import flatten_tree

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=1e6,
    rms_norm_eps=1e-5,
    sliding_window=8,
)
PROMPT_LEN = 40


def build(directory, experts: int = 8, tie: bool = False):
    """A seeded tiny MixtralForCausalLM saved with save_pretrained; norms jittered, router sharpened."""
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(**BASE, num_local_experts=experts, num_experts_per_tok=2, tie_word_embeddings=tie)
    model = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            elif name.endswith("mlp.gate.weight"):  # decisive routing: no near-ties between experts
                p.mul_(20.0)
    model.save_pretrained(directory)
    return model


def hf_routes(model, ids: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """transformers' logits and, per layer, the router's chosen experts [T, k] (forward hooks on the routers)."""
    routes: list[np.ndarray] = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda _m, _i, out: routes.append(out[2].numpy()))
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
    finally:
        for h in hooks:
            h.remove()
    return logits, routes


def our_routes(runner: ModelRunner, ids: list[int]) -> list[np.ndarray]:
    """Our chosen experts per layer (the SparseMoE blocks' sown intermediates) for one prefill chunk."""
    step = runner.pack([Chunk(runner.allocator.allocate(10), 0, ids, rows=[0])])
    decoder = Decoder(runner.cfg, jnp.dtype(runner.dtype))
    _, state = decoder.apply(
        {"params": runner.params}, jnp.asarray(step.tokens), step.meta, runner.pool, mutable=["intermediates"]
    )
    inter = state["intermediates"]
    return [np.asarray(inter[f"layers_{i}"]["mlp"]["experts"][0])[: len(ids)] for i in range(runner.cfg.num_layers)]


@pytest.mark.parametrize("experts, tie", [(8, False), (4, True)])
def test_logits_routing_and_greedy_match_transformers(tmp_path, experts, tie):
    theirs = build(tmp_path, experts, tie)
    cfg, params = load_model_params(str(tmp_path), cache=False)
    assert (cfg.arch, cfg.num_experts, cfg.experts_per_token, cfg.layer_windows()) == ("mixtral", experts, 2, [8] * 3)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 128, size=PROMPT_LEN)]
    ref, hf_experts = hf_routes(theirs, ids)
    runner = ModelRunner(cfg, params, num_pages=40, page_size=4, max_seq_len=64)
    pages = runner.allocator.allocate(10)
    mine = runner.logits(runner.pack([Chunk(pages, 0, ids, rows=list(range(PROMPT_LEN)))]))
    assert np.abs(mine - ref).max() <= 1e-4, np.abs(mine - ref).max()
    for layer, (ours, hf) in enumerate(zip(our_routes(runner, ids), hf_experts)):  # same experts, same order
        np.testing.assert_array_equal(ours, hf, err_msg=f"layer {layer}")
    unwindowed = ModelRunner(
        cfg.replace(sliding_window=None, layer_types=()), params, num_pages=40, page_size=4, max_seq_len=64
    )
    step = unwindowed.pack([Chunk(unwindowed.allocator.allocate(10), 0, ids, rows=list(range(PROMPT_LEN)))])
    assert np.abs(unwindowed.logits(step) - ref).max() > 0.1  # the window (8 < 40 tokens) matters

    # Greedy through the paged cache: two sequences decode together (gathered experts; prefills are grouped).
    runner.allocator.release(pages)
    assert runner.min_token_bucket == 1 and cfg.moe_impl_for(2) == "gather" and cfg.moe_impl_for(12) == "ragged"
    prompts = [ids[:12], ids[20:29]]
    ours = greedy_generate(runner, prompts, 16)
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            out = theirs.generate(
                torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        assert got == out[0, len(prompt) :].tolist()


def test_bfloat16_tracks_float32(tmp_path):
    theirs = build(tmp_path)
    ids = list(range(3, 35))
    logits, routes = {}, {}
    for dtype in ("float32", "bfloat16"):
        cfg, params = load_model_params(str(tmp_path), dtype=dtype, cache=False)
        runner = ModelRunner(cfg, params, num_pages=32, page_size=4, max_seq_len=64)
        assert str(runner.pool.k[0].dtype) == dtype
        logits[dtype] = runner.logits(runner.pack([Chunk(runner.allocator.allocate(8), 0, ids, rows=list(range(32)))]))
        routes[dtype] = np.stack(our_routes(runner, ids))
    diff = np.abs(logits["float32"] - logits["bfloat16"]).max()
    assert diff <= 0.05 * np.abs(logits["float32"]).max(), diff
    # Most first choices survive bf16 rounding of the hidden states (near-ties may flip).
    assert (routes["float32"][..., 0] == routes["bfloat16"][..., 0]).mean() >= 0.9
    hf_logits, _ = hf_routes(theirs.to(torch.bfloat16), ids)
    assert np.abs(logits["bfloat16"] - hf_logits).max() <= 0.05 * np.abs(hf_logits).max()


def write_mixtral_gguf(path, state: dict, experts: int, stacked: bool, num_layers: int = 3) -> None:
    """The tensors llama.cpp writes for Mixtral ("llama" arch + expert counts, Q/K rows permuted), as F32."""
    from gguf.gguf_writer import GGUFWriter

    def permute(w: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp's convert_hf_to_gguf permutation
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    writer = GGUFWriter(str(path), "llama")
    for key, value in dict(
        block_count=num_layers,
        context_length=256,
        embedding_length=64,
        feed_forward_length=48,
        head_count=4,
        head_count_kv=2,
        layer_norm_rms_eps=1e-5,
        rope_freq_base=1e6,
        expert_count=experts,
        expert_used_count=2,
    ).items():
        getattr(writer, f"add_{key}")(value)
    get = lambda name: state[name].float().numpy()  # noqa: E731
    dense = {k: v for k, v in HF_NAMES["mixtral"].items() if "/mlp/" not in k}
    for leaf, hf_name in {**dense, "lm_head/kernel": "lm_head.weight"}.items():
        full = hf_name if hf_name.startswith("lm_head") else "model." + hf_name
        for i in range(num_layers) if "{i}" in full else [None]:
            w = get(full.format(i=i))
            if leaf in ("layers/attn/q/kernel", "layers/attn/k/kernel"):
                w = permute(w, 4 if leaf.endswith("q/kernel") else 2)
            writer.add_tensor(GGUF_NAMES[leaf] if i is None else GGUF_NAMES[leaf].format(i=i), w)
    hf_exp = {"gate": "w1", "up": "w3", "down": "w2"}
    for i in range(num_layers):
        writer.add_tensor(
            GGUF_MOE_NAMES["layers/mlp/router/kernel"].format(i=i),
            get(f"model.layers.{i}.block_sparse_moe.gate.weight"),
        )
        for ours, theirs in hf_exp.items():
            per_expert = [get(f"model.layers.{i}.block_sparse_moe.experts.{j}.{theirs}.weight") for j in range(experts)]
            leaf = f"layers/mlp/{ours}/kernel"
            if stacked:
                writer.add_tensor(GGUF_MOE_NAMES[leaf].format(i=i), np.stack(per_expert))
            else:
                for j, w in enumerate(per_expert):
                    writer.add_tensor(GGUF_MOE_LEGACY_NAMES[leaf].format(i=i, j=j), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("stacked", [True, False], ids=["exps", "per-expert"])
def test_gguf_equals_the_hf_checkpoint(tmp_path, stacked):
    from safetensors.torch import load_file

    build(tmp_path / "hf", experts=4)
    state = load_file(tmp_path / "hf" / "model.safetensors")  # the names save_pretrained wrote
    write_mixtral_gguf(tmp_path / "m.gguf", state, 4, stacked)
    hf_cfg, hf_params = load_hf(tmp_path / "hf")
    gg_cfg, gg_params = load_gguf(tmp_path / "m.gguf")
    same = dict(
        name="",
        bos_token_id=None,
        eos_token_ids=(),
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        sliding_window=None,
        layer_types=(),
    )  # llama.cpp writes no window for Mistral-family files
    assert gg_cfg.replace(**same) == hf_cfg.replace(**same)
    assert (gg_cfg.arch, gg_cfg.num_experts, gg_cfg.experts_per_token) == ("mixtral", 4, 2)
    ours, theirs = flatten_tree(gg_params), flatten_tree(hf_params)
    assert sorted(ours) == sorted(theirs) and ours["layers/mlp/gate/kernel"].shape == (3, 4, 64, 48)
    for leaf in ours:
        np.testing.assert_array_equal(np.asarray(ours[leaf]), np.asarray(theirs[leaf]), err_msg=leaf)


def test_fused_in_memory_names_load_too(tmp_path):
    from safetensors.torch import save_file

    model = build(tmp_path / "hf", experts=4)
    fused = tmp_path / "fused"
    fused.mkdir()
    (fused / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, fused / "model.safetensors")
    a, b = flatten_tree(load_hf(tmp_path / "hf")[1]), flatten_tree(load_hf(fused)[1])
    assert sorted(a) == sorted(b)
    for leaf in a:
        np.testing.assert_array_equal(a[leaf], b[leaf], err_msg=leaf)


MIXTRAL = dict(BASE, num_local_experts=4, num_experts_per_tok=2, model_type="mixtral")


@pytest.mark.parametrize(
    "raw, words",
    [
        ({**MIXTRAL, "shared_expert_intermediate_size": 32}, ["mixtral", "shared experts"]),
        ({**MIXTRAL, "norm_topk_prob": False}, ["mixtral", "norm_topk_prob=false"]),
        ({**MIXTRAL, "num_experts_per_tok": 5}, ["experts_per_token=5", "num_experts=4"]),
        ({**MIXTRAL, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ["RoPE scaling type 'yarn'"]),
        ({**MIXTRAL, "router_jitter_noise": 0.1, "output_router_logits": True, "router_aux_loss_coef": 0.02}, None),
    ],
    ids=["shared", "unnormalised", "top-k", "yarn", "training-only-fields-ignored"],
)
def test_config_errors_are_one_line(tmp_path, raw, words):
    from specrag_jax.models.loading.hf_config import hf_config_to_model_config

    if words is None:
        assert hf_config_to_model_config(raw).num_experts == 4
        return
    with pytest.raises(SpecRagError) as err:
        hf_config_to_model_config(raw)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


def test_mismatched_and_missing_expert_tensors(tmp_path):
    from safetensors.torch import load_file, save_file

    build(tmp_path, experts=4)
    state = load_file(tmp_path / "model.safetensors")
    name = "model.layers.1.block_sparse_moe.experts.2.w1.weight"
    bad = {**state, name: state[name][:40].contiguous()}
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(SpecRagError) as err:
        load_hf(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and name in msg and "(64, 40)" in msg and "expected (64, 48)" in msg, msg
    del bad[name]
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(SpecRagError, match=r"missing tensor 'model\.layers\.1\.block_sparse_moe\.experts\.2\.w1"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**MIXTRAL, "num_local_experts": 3}))
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(SpecRagError, match=r"block_sparse_moe\.gate\.weight.*\(64, 4\).*expected \(64, 3\)"):
        load_hf(tmp_path)
