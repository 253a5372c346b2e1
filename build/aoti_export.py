"""AOTInductor variants: the family-wrapped model through `torch.export.export` and compiled ahead of
time by `torch._inductor.aoti_compile_and_package` into a `.pt2` package (generated C++/OpenMP
kernels and the frozen weights in one file, built here with the host's C++ compiler for its CPU).
The worker loads it with `torch._inductor.aoti_load_package` (handlers/aoti.py): no Python model
code and no TorchScript runtime at serve time.

One package serves every batch size: the batch dimension of every input is dynamic, and so is the
sequence dimension of 2-D integer inputs (token ids and masks); every other dimension (an image's
channels and size) is fixed at the exported example's, which lets Inductor specialise its kernels.
A reduced precision (runtime.precision bf16/fp16, where this CPU runs it natively) is exported as
an autocast region inside the graph, so its casts are compiled in, as a TorchScript trace keeps them.
Inductor's freezing folds the weights into the compiled graph (batch norms into their convolutions;
oneDNN prepacks the convolutions and linear layers and fuses their activations); it needs autograd
off while compiling, or Inductor skips it without a word. Its generated kernels take their thread
count from the worker at run time (`cpp.dynamic_threads`): by default Inductor writes the compiling process's count into every
parallel loop, and the build's count is not the worker's (the tuner sets that per worker).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional

import torch

from build.errors import ExportError
from build.shapes import dynamic_shapes

INDUCTOR_CONFIGS = {"freezing": True, "cpp.dynamic_threads": True}
DRAFT = "torch.export.draft_export(model, args, dynamic_shapes=...) lists every problem at once"


class _Exported(torch.nn.Module):
    """The model as exported: positional inputs; under a reduced precision, an autocast region with
    the output back in fp32, so the casts are part of the graph."""

    def __init__(self, model: torch.nn.Module, dtype: Optional[torch.dtype]) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, *inputs):
        if self.dtype is None:
            return self.model(*inputs)
        with torch.autocast("cpu", dtype=self.dtype):
            out = self.model(*inputs)
        return out.float() if isinstance(out, torch.Tensor) else out


def export_program(model: torch.nn.Module, example: tuple[torch.Tensor, ...], dtype: Optional[torch.dtype],
                   where: str) -> torch.export.ExportedProgram:
    """torch.export with dynamic batch (and sequence) dimensions; a failure names `where` and the fix."""
    module = _Exported(model.eval(), dtype)
    try:
        with torch.no_grad():
            return torch.export.export(module, example, dynamic_shapes=(dynamic_shapes(example),))
    except Exception as err:  # noqa: BLE001 - the exporter raises many types (UserError, Unsupported, ...)
        raise ExportError(f"{where}: torch.export failed ({type(err).__name__}: {_first_line(err)}): "
                          f"{_fix(err)}; or drop aoti from the entry's variants (the others still build)") from None


def compile_package(program: torch.export.ExportedProgram, target: Path, where: str) -> Path:
    """AOTInductor: the exported program compiled into a `.pt2` package at `target`."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        raise ExportError(f"{where}: AOTInductor needs a C++ compiler at build time and none is on PATH: install "
                          "g++ (apt-get install g++), or drop aoti from the entry's variants")
    try:
        with torch.no_grad():  # Inductor applies freezing only with autograd off, silently otherwise
            path = torch._inductor.aoti_compile_and_package(program, package_path=str(target),
                                                            inductor_configs=dict(INDUCTOR_CONFIGS))
    except Exception as err:  # noqa: BLE001 - Inductor's lowering and the C++ compiler raise many types
        raise ExportError(f"{where}: AOTInductor compile failed ({type(err).__name__}: {_first_line(err)}): "
                          "drop aoti from the entry's variants (the others still build)") from None
    return Path(path)


def export_aoti(model: torch.nn.Module, example: tuple[torch.Tensor, ...], target: Path,
                dtype: Optional[torch.dtype], where: str) -> Path:
    return compile_package(export_program(model, example, dtype, where), target, where)


def compiler_version() -> str:
    """The C++ compiler's first line of `--version` (an input of the build's content hash)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return "none"
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (done.stdout.splitlines() or ["unknown"])[0]


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[0] if lines else "no message")[:300]


def _fix(err: BaseException) -> str:
    """What to change, for the exporter's common refusals."""
    text = str(err)
    if "specialized" in text or "Constraints violated" in text:
        return ("the model fixes the size of a dimension exported as dynamic (batch, or the sequence of token "
                "inputs): remove the size-dependent code (a reshape to a constant, a Python int of a shape), "
                f"or export it yourself; {DRAFT}")
    if "data-dependent" in text or "Could not guard on data-dependent" in text or "GuardOnDataDependent" in text:
        return ("the model branches on a tensor's values (data-dependent control flow): rewrite the branch with "
                f"torch.cond, or compute it outside the model; {DRAFT}")
    return f"make the model exportable (torch.export's programming model); {DRAFT}"
