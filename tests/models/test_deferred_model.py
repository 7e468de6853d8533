"""``DeferredTextModel``: name, tokenizer, config and cost without loading; one load on first use, from any thread."""

from __future__ import annotations

import threading

import pytest

from specrag_jax.models.deferred_model import DeferredTextModel, ensure_loaded
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.roofline import model_cost

SMOL = "smollm2-135m-instruct"


@pytest.mark.slow
def test_nothing_loads_until_first_use_and_then_once():
    calls = []

    def load() -> TextModel:
        calls.append(threading.get_ident())
        return TextModel.load(SMOL, max_seq_len=256, max_batch=1)

    model = DeferredTextModel(SMOL, load)
    assert not model.loaded and model.load_s == 0.0 and model.cfg.num_layers == 30
    assert model.tokenizer.encode("hello world") and not calls  # tokenising reads no weights
    estimated = model_cost(model)  # from the config alone
    assert not calls
    threads = [threading.Thread(target=lambda: model.runner) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and model.loaded and model.load_s > 0
    exact = model_cost(model)  # the loaded weights' bytes
    assert abs(estimated.weight_bytes / exact.weight_bytes - 1) < 0.01
    assert (estimated.body_params, estimated.head_params) == (exact.body_params, exact.head_params)
    assert model.generate(["Hi"], max_new_tokens=2)[0].text is not None  # delegates to the TextModel
    assert ensure_loaded(model) == 0.0 and len(calls) == 1


def test_ensure_loaded_leaves_other_models_alone():
    assert ensure_loaded(object()) == 0.0
