"""One exception type for every user-facing error, so callers and the CLI can print one clear line."""


class SpecRagError(ValueError):
    """Bad input or an unusable resource, with a message that names the problem."""
