"""engine_per_model: roles that share a model share one engine; distinct_engines lists each once."""

from types import SimpleNamespace

from specrag_jax.models.engine.per_model import distinct_engines, engine_per_model


def test_roles_on_one_model_share_its_engine():
    a, b = SimpleNamespace(runner=object()), SimpleNamespace(runner=object())
    made: list[str] = []

    def make(role, model):
        made.append(role)
        return SimpleNamespace(name=role, model=model)

    shared = engine_per_model({"drafter": a, "verifier": a}, make)
    assert made == ["drafter"] and shared["drafter"] is shared["verifier"]
    assert list(distinct_engines(shared)) == ["drafter"]
    made.clear()
    apart = engine_per_model({"drafter": a, "verifier": b}, make)
    assert made == ["drafter", "verifier"] and apart["drafter"] is not apart["verifier"]
    assert list(distinct_engines(apart)) == ["drafter", "verifier"]
