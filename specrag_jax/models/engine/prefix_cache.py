"""Radix prefix cache over the page allocator: page-granular, reference-counted, LRU eviction.

Each node is one full page of tokens (its key) below its parent's prefix; the cache holds one reference to
every page in it, so a page shared by running sequences and the cache returns to the pool only when both
let go. A page referenced by the cache alone is *cached* (evictable); eviction removes least recently used
leaves first, so popular prefixes (instructions, questions) survive across requests.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from specrag_jax.kernels import PageAllocator


class _Node:
    __slots__ = ("key", "page", "parent", "children", "last_used")

    def __init__(self, key: tuple[int, ...], page: int, parent: "_Node | None", now: int) -> None:
        self.key, self.page, self.parent = key, page, parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.last_used = now


class PrefixCache:
    """Longest-prefix match and insertion of full pages of tokens; the caller owns matched references."""

    def __init__(self, allocator: PageAllocator, page_size: int, *, enabled: bool = True) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.enabled = enabled
        self._root = _Node((), -1, None, 0)
        self._clock = itertools.count(1)
        self._nodes: dict[int, _Node] = {}  # page -> node
        self.lookup_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of those, served from cached pages (prefill tokens saved)
        self.evicted_pages = 0

    # ------------------------------------------------------------------ queries
    @property
    def num_pages(self) -> int:
        """Pages held by the cache (shared with running sequences or not)."""
        return len(self._nodes)

    @property
    def num_cached_only(self) -> int:
        """Pages referenced by the cache alone (evictable)."""
        return sum(self.allocator.refcount(p) == 1 for p in self._nodes)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    # ------------------------------------------------------------------ operations
    def match(self, tokens: Sequence[int], max_pages: int, *, count: bool = True) -> list[int]:
        """Pages of the longest cached page-aligned prefix of ``tokens`` (at most ``max_pages``), retained.

        Each returned page carries one new reference that the caller must release. ``count=False``: a lookup
        that is not a prompt's (seeding), left out of the hit-rate counters.
        """
        self.lookup_tokens += len(tokens) if count else 0
        if not self.enabled:
            return []
        ps, node, pages = self.page_size, self._root, []
        now = next(self._clock)
        for i in range(min(max_pages, len(tokens) // ps)):
            child = node.children.get(tuple(int(t) for t in tokens[i * ps : (i + 1) * ps]))
            if child is None:
                break
            child.last_used = now
            pages.append(child.page)
            node = child
        self.allocator.retain(pages)
        self.hit_tokens += len(pages) * ps if count else 0
        return pages

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> int:
        """Record the full pages of ``tokens`` (``pages[i]`` holds tokens of page i); returns pages added.

        Where a page of the same tokens is already cached the existing one is kept.
        """
        if not self.enabled:
            return 0
        ps, node, added = self.page_size, self._root, 0
        now = next(self._clock)
        for i in range(min(len(tokens) // ps, len(pages))):
            key = tuple(int(t) for t in tokens[i * ps : (i + 1) * ps])
            child = node.children.get(key)
            if child is None:
                page = int(pages[i])
                if page in self._nodes:  # the page already sits elsewhere in the tree: stop here
                    break
                self.allocator.retain([page])
                child = node.children[key] = _Node(key, page, node, now)
                self._nodes[page] = child
                added += 1
            child.last_used = now
            node = child
        return added

    def evict(self, n: int) -> int:
        """Free up to ``n`` cache-only pages, least recently used leaves first; returns pages freed."""
        freed = 0
        while freed < n:
            leaves = [x for x in self._nodes.values() if not x.children and self.allocator.refcount(x.page) == 1]
            if not leaves:
                break
            leaves.sort(key=lambda x: x.last_used)
            for leaf in leaves[: n - freed]:
                self._remove(leaf)
                freed += 1
        self.evicted_pages += freed
        return freed

    def clear(self) -> int:
        """Drop every node whose page only the cache holds (repeatedly, leaves first); returns pages freed."""
        return self.evict(len(self._nodes))

    def _remove(self, leaf: _Node) -> None:
        assert leaf.parent is not None
        del leaf.parent.children[leaf.key]
        del self._nodes[leaf.page]
        self.allocator.release([leaf.page])
