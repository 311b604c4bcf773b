"""Shared fixtures: dispatchers on the FlyDSL backend's reference and emulator executors, and a native that
records calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from te_flydsl_plugin import llvm
from te_flydsl_plugin.host import dispatch


class RecordingNative:
    """Stands in for TE's generic_gemm: records every call; returns a marker so tests see it ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append((args, kwargs))
        return ["native", None, None, None]


@pytest.fixture
def native() -> RecordingNative:
    return RecordingNative()


@pytest.fixture
def reference_dispatcher() -> Iterator[dispatch.Dispatcher]:
    """The FlyDSL backend selected, plans executed by the reference executor, for every format."""
    d = dispatch.configure(backend="flydsl", executor="reference", env={})
    yield d
    dispatch.configure(backend="default", executor=None, env={})


@pytest.fixture
def emulator_dispatcher() -> Iterator[dispatch.Dispatcher]:
    """The FlyDSL backend selected, plans executed by the emulator executor (compiled gfx950 code on CPU)."""
    if llvm.find_ld_lld() is None:
        pytest.skip("no ld.lld >= 18: gfx950 code cannot be compiled")
    d = dispatch.configure(backend="flydsl", executor="emulator", env={})
    yield d
    dispatch.configure(backend="default", executor=None, env={})
