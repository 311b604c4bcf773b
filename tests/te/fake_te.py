"""A minimal, file-based stand-in for Transformer Engine's GEMM seam, for CPU tests of host/te.py.

It mirrors exactly what the seam relies on in TE 2.20.2: the extension module
``transformer_engine_torch`` with ``DType`` and ``generic_gemm``; ``general_gemm`` in
``transformer_engine.pytorch.cpp_extensions.gemm`` looking ``tex.generic_gemm`` up at call time; the
storage classes by their real module paths and attribute names; optionally a ROCm-style in-tree
``get_gemm_backend()`` that routes ``NVTE_GEMM_BACKEND=flydsl`` past ``generic_gemm``. The real
thing is exercised by the other tests in this folder on a CUDA machine.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

TEX = """
import enum
import torch

DType = enum.IntEnum("DType", {n: i for i, n in enumerate(
    ["kByte", "kInt16", "kInt32", "kInt64", "kFloat32", "kFloat16", "kBFloat16",
     "kFloat8E4M3", "kFloat8E5M2", "kFloat8E8M0", "kFloat4E2M1"])})

def generic_gemm(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu, gelu_in, grad,
                 workspace, workspace_size, accumulate, use_split_accumulator, comm_overlap=None,
                 comm_type=None, extra_output=None, bulk_overlap=False, alpha=1.0, beta=None):
    a = A.T if transA else A
    b = B.T if transB else B
    return [b @ a, None, None, extra_output]
"""

QUANTIZED = """
import torch

class QuantizedTensorStorage:
    pass

class QuantizedTensor(torch.Tensor):
    pass
"""

FP8 = """
from transformer_engine.pytorch.quantized_tensor import QuantizedTensorStorage

class Float8TensorStorage(QuantizedTensorStorage):
    def __init__(self, data, transpose, scale_inv, fp8_dtype, transpose_invalid):
        self._data = data
        self._transpose = transpose
        self._scale_inv = scale_inv
        self._fp8_dtype = fp8_dtype
        self._transpose_invalid = transpose_invalid

    def size(self):
        if self._data is not None:
            return self._data.shape
        raise RuntimeError("no rowwise data")
"""

MXFP8 = """
from transformer_engine.pytorch.quantized_tensor import QuantizedTensorStorage

class MXFP8TensorStorage(QuantizedTensorStorage):
    def __init__(self, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, fp8_dtype,
                 with_gemm_swizzled_scales=False):
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._fp8_dtype = fp8_dtype
        self._with_gemm_swizzled_scales = with_gemm_swizzled_scales

    def size(self):
        d = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        return d.shape
"""

NVFP4 = """
from transformer_engine.pytorch.quantized_tensor import QuantizedTensorStorage

class NVFP4TensorStorage(QuantizedTensorStorage):
    def __init__(self, shape):
        self._shape = shape

    def size(self):
        return self._shape
"""

GEMM = """
import transformer_engine_torch as tex
from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import Float8TensorStorage
from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage
from transformer_engine.pytorch.tensor.storage.nvfp4_tensor_storage import NVFP4TensorStorage
{rocm}

def general_gemm(A, B, layout="TN", out_dtype=None):
    {route}
    out, *_ = tex.generic_gemm(A, layout[0] == "T", B, layout[1] == "T", None, None, out_dtype, None,
                               tex.DType.kBFloat16, False, None, False, None, 0, False, False)
    return out
"""

ROCM_GETTER = """
import functools
import os

IN_TREE_CALLS = []

@functools.lru_cache(maxsize=None)
def get_gemm_backend():
    return os.environ.get("NVTE_GEMM_BACKEND", "default").strip().lower()
"""

ROCM_ROUTE = '''if get_gemm_backend() == "flydsl":
        IN_TREE_CALLS.append(layout)
        return "in-tree"'''

PYTORCH_INIT = """
import torch
from transformer_engine.pytorch.cpp_extensions import gemm
from transformer_engine.pytorch import constants
"""

CONSTANTS = """
import enum
import transformer_engine_torch as tex

DType = enum.IntEnum("DType", {m.name: int(m) for m in tex.DType})
"""


def write_fake_te(root: Path, *, rocm_in_tree: bool = False) -> Path:
    """Write the fake TE packages under ``root`` and return it (put it on ``sys.path``)."""
    files = {
        "transformer_engine_torch.py": TEX,
        "transformer_engine/__init__.py": '__version__ = "2.20.2+fake"\n',
        "transformer_engine/pytorch/__init__.py": PYTORCH_INIT,
        "transformer_engine/pytorch/constants.py": CONSTANTS,
        "transformer_engine/pytorch/quantized_tensor.py": QUANTIZED,
        "transformer_engine/pytorch/tensor/__init__.py": "",
        "transformer_engine/pytorch/tensor/storage/__init__.py": "",
        "transformer_engine/pytorch/tensor/storage/float8_tensor_storage.py": FP8,
        "transformer_engine/pytorch/tensor/storage/mxfp8_tensor_storage.py": MXFP8,
        "transformer_engine/pytorch/tensor/storage/nvfp4_tensor_storage.py": NVFP4,
        "transformer_engine/pytorch/cpp_extensions/__init__.py": "",
        "transformer_engine/pytorch/cpp_extensions/gemm.py": GEMM.format(
            rocm=ROCM_GETTER if rocm_in_tree else "", route=ROCM_ROUTE if rocm_in_tree else "pass"
        ),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def forget_fake_te() -> None:
    """Drop every fake TE module from ``sys.modules`` (each test starts from a fresh import)."""
    for name in list(sys.modules):
        if name == "transformer_engine_torch" or name.split(".")[0] == "transformer_engine":
            del sys.modules[name]
