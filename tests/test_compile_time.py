"""Compile-time accounting: a thread's own totals count what that thread compiled, not other threads' work."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp

from specrag_jax.compile_time import CompileClock, compile_stats, thread_compile_stats


def _compile_new_program(scale: float) -> None:
    jax.jit(lambda x: jnp.sin(x) * scale + jnp.cos(x) * (scale + 1.0))(jnp.arange(7.0)).block_until_ready()


def test_thread_totals_count_only_the_calling_threads_compiles():
    start, start_all = thread_compile_stats(), compile_stats()
    worker = threading.Thread(target=_compile_new_program, args=(3.25,))
    worker.start()
    worker.join()
    other = thread_compile_stats() - start
    assert other.programs == 0 and other.total_s == 0.0  # the other thread's program is not this thread's
    assert (compile_stats() - start_all).programs >= 1  # the process-wide totals did see it
    with CompileClock() as clock:
        _compile_new_program(4.5)
    own = thread_compile_stats() - start
    assert own.programs >= 1 and own.total_s > 0.0
    assert own.total_s <= clock.seconds + 1e-9
