"""Builds the optional compiled decision path, ``te_flydsl_plugin/host/_hotpath.cpp`` (pyproject.toml holds
everything else).

It includes torch's headers and links its libraries, so it is built against the torch of the build
environment: ``pip install --no-build-isolation`` (README, tools/setup.sh) builds it against the installed
torch, as TE itself is built. Where torch is not importable while building (pip's default isolated build)
or no C++ compiler works, the package installs without it and ``host/wrapper.py``'s Python path decides
every call (``te-flydsl-plugin doctor`` says which path is active, and why).
"""

from __future__ import annotations

import sys

from setuptools import setup

SOURCE = "te_flydsl_plugin/host/_hotpath.cpp"
MODULE = "te_flydsl_plugin.host._hotpath"


def _skip(why: str) -> None:
    print(f"te-flydsl-plugin: not building {MODULE} ({why}); the Python decision path will decide", file=sys.stderr)


def _extension() -> tuple[list, dict]:
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as exc:
        _skip(f"torch is not importable in the build environment: {exc}; pip install --no-build-isolation")
        return [], {}

    class OptionalBuild(BuildExtension):
        """torch's BuildExtension (its ABI flags and include paths), where a failure leaves the Python path."""

        def run(self) -> None:
            try:
                super().run()
            except Exception as exc:  # no compiler, or one that cannot build torch's headers
                _skip(f"{type(exc).__name__}: {exc}")

        def build_extension(self, ext) -> None:
            try:
                super().build_extension(ext)
            except Exception as exc:
                _skip(f"{type(exc).__name__}: {exc}")

    # torch 2.13's headers need C++20 (default member initialisers of bit-fields in c10/core/AutogradState.h).
    ext = CppExtension(MODULE, [SOURCE], extra_compile_args=["-O2", "-std=c++20"])
    return [ext], {"build_ext": OptionalBuild.with_options(use_ninja=False)}


_ext_modules, _cmdclass = _extension()
setup(ext_modules=_ext_modules, cmdclass=_cmdclass)
