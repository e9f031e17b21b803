import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# CI's tier's two whole runs, its longest files: collected first, so that pytest-xdist (--dist loadfile hands out
# files in collection order) starts them first and the other worker takes the short files meanwhile. Collected in
# directory order they came last, and the suite waited for them alone on one core.
LONGEST_FIRST = ("tests/integration/runs/test_e2e.py", "tests/integration/runs/agentic/test_tools_run.py")


def is_scenario(nodeid: str) -> bool:
    """Whether tests/tiers.py names the test (its file, the test, or a glob over its id) as a scenario."""
    from fnmatch import fnmatchcase

    from tests.tiers import SCENARIOS

    return any(nodeid == e or nodeid.startswith((e + "::", e + "[")) or fnmatchcase(nodeid, e) for e in SCENARIOS)


def pytest_collection_modifyitems(config, items):
    """The scenarios (tests/tiers.py) are marked `scenario`; GPU-marked tests skip without CUDA; integration tests
    are marked by directory; LONGEST_FIRST go first."""
    def rank(item) -> int:
        return next((i for i, f in enumerate(LONGEST_FIRST) if item.nodeid.startswith(f)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    for item in items:
        if is_scenario(item.nodeid):
            item.add_marker(pytest.mark.scenario)
        path = str(item.fspath)
        if f"{os.sep}integration{os.sep}" in path:
            item.add_marker(pytest.mark.integration)
        if f"{os.sep}gpu{os.sep}" in path:
            item.add_marker(pytest.mark.gpu)
            if not has_cuda:
                item.add_marker(pytest.mark.skip(reason="needs CUDA"))


@pytest.fixture(scope="session")
def tiny_model_path():
    from orchestrator.builtin.models.tiny import ensure_tiny_model

    return str(ensure_tiny_model())


@pytest.fixture(scope="session")
def tiny_vlm_path():
    """rayward's tiny random Qwen2.5-VL (orchestrator/builtin/models/vlm.py), built once into the cache."""
    from orchestrator.builtin.models.vlm import ensure_tiny_vlm

    return str(ensure_tiny_vlm())


@pytest.fixture(scope="session")
def tiny_tool_vlm_path():
    """The tiny VLM warmed up on the cards task, its tool returning an image (orchestrator/builtin/models/vlm.py), built
    once into the cache."""
    from orchestrator.builtin.models.vlm import ensure_tiny_tool_vlm

    return str(ensure_tiny_tool_vlm())


@pytest.fixture(scope="session")
def no_checkpointing_model_path(tmp_path_factory, tiny_model_path):
    """A tiny random JetMoe causal LM (transformers declares no gradient checkpointing for it) with the tiny model's
    tokenizer files."""
    import shutil

    from transformers import JetMoeConfig, JetMoeForCausalLM

    out = tmp_path_factory.mktemp("jetmoe")
    config = JetMoeConfig(vocab_size=512, hidden_size=64, num_hidden_layers=1, num_key_value_heads=2, kv_channels=16,
                          intermediate_size=64, num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=128)
    JetMoeForCausalLM(config).save_pretrained(out)
    for f in Path(tiny_model_path).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    return str(out)
