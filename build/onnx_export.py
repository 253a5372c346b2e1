"""ONNX variants: the family-wrapped model exported to ONNX, optionally int8-quantised by ONNX Runtime.

Both `onnx` and `onnx-int8` are exported through torch.export (`dynamo=True`, opset 20; build/shapes.py
says which dimensions are dynamic: the batch, and the sequence of token inputs). That exporter numbers
the graph's nodes (`node_MatMul_92`), which is what `keep_fp32` refers to: the numbers follow the
order of the exported program, so they hold from one export to the next of the same model, and a
change to the model's code, its wrapper or torch can renumber them. The build then stops on a name
that is no longer in the graph; `python -m build.int8_search` lists the current ones.

int8: ONNX Runtime's dynamic quantisation of MatMul/Gemm weights (activations quantised on the fly),
per output channel by default: per tensor, MiniLM's min cosine to fp32 fell to 0.76 (a single
outlier column sets the scale of the whole matrix). The nodes in `keep_fp32` stay fp32: the
sensitive ones (`python -m build.int8_search` finds them on a calibration set).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from build.errors import ExportError
from build.shapes import dynamic_shapes

OPSET = 20  # the first with a Gelu operator: ONNX Runtime runs it fused (docs/optimisations.md#onnx-runtime)


def export_onnx(model: torch.nn.Module, example: tuple[torch.Tensor, ...], target: Path) -> Path:
    """Through torch.export, the batch (and token inputs' sequence) dynamic; node names numbered."""
    names = [f"input_{i}" for i in range(len(example))]
    try:
        with torch.no_grad():
            torch.onnx.export(model.eval(), example, str(target), input_names=names, output_names=["output"],
                              dynamic_shapes=dynamic_shapes(example), opset_version=OPSET, dynamo=True,
                              external_data=False, verbose=False)
    except Exception as err:  # noqa: BLE001 - torch.export and the ONNX translation raise many types
        raise ExportError(f"ONNX export (torch.export-based) failed ({type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0][:300] if str(err).strip() else 'no message'}): "
                          "drop onnx and onnx-int8 from the entry's variants, or make the model exportable "
                          "(torch.export.draft_export lists every problem)") from None
    return target


def quantize_int8(source: Path, target: Path, keep_fp32: Sequence[str] = (), per_channel: bool = True) -> Path:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = {node.name for node in onnx.load(str(source), load_external_data=False).graph.node}
    unknown = [name for name in keep_fp32 if name not in nodes]
    if unknown:
        raise ExportError(f"keep_fp32: no node {unknown[0]!r} in the exported graph "
                          "(python -m build.int8_search --model <name> lists the MatMul nodes)")
    quiet = logging.getLogger()  # the quantiser logs a pre-processing hint through the root logger
    level, quiet.level = quiet.level, logging.ERROR
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=per_channel,
                         op_types_to_quantize=["MatMul", "Gemm"], nodes_to_exclude=list(keep_fp32))
    finally:
        quiet.level = level
    return target


def matmul_nodes(path: Path) -> tuple[str, ...]:
    """The graph's MatMul/Gemm nodes that have a weight (an initializer) to quantise."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return tuple(n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and any(i in weights for i in n.input))
