"""The stock baseline: naive handlers written the way TorchServe's docs and examples show.

Eager fp32, torch's default threads, one image decoded and resized at a time with PIL, text padded
to max_length 128 -- served under TorchServe's defaults (batch size 1, default worker count).
`archive.build_baseline` packages them with torch-model-archiver's Python API. The handler and
model files here go *inside* the archives: they import only torch, PIL, transformers and ts.
"""
