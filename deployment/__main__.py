"""python -m deployment: write deploy/ from config.properties and its mix record, size replicas,
validate offline. `make deploy` / `make plan RATE=... [MIX=...] [HEADROOM=...]` call this."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from deployment import gpu, image, inputs, k8s, kserve, plan, validate
from deployment.errors import DeployError
from serving.repo import REPO_ROOT


def say(message: str) -> None:
    print(message, flush=True)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m deployment", description=__doc__)
    p.add_argument("--config", type=Path, default=REPO_ROOT / "config.properties",
                   help="config.properties with a mix record (default: the repository's)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "deploy", help="output folder (default: deploy/)")
    p.add_argument("--rate", type=float, default=None,
                   help="requests/s to plan for (default: one replica's usable rate, so 1 replica)")
    p.add_argument("--mix", default=None, help="expected traffic, e.g. minilm=0.7,efficientnet_lite0=0.3: "
                   "must match the tuned mix within 0.05 per share")
    p.add_argument("--headroom", type=float, default=plan.DEFAULT_HEADROOM,
                   help=f"fraction of each replica's capacity kept free (default {plan.DEFAULT_HEADROOM})")
    p.add_argument("--plan", action="store_true",
                   help="print the plan and rewrite only k8s/hpa.yaml (everything when the folder is absent)")
    p.add_argument("--check", action="store_true", help="only validate the folder's manifests (no writing)")
    p.add_argument("--gpus", type=int, default=0,
                   help="GPUs per replica: torch's CUDA build in the image, nvidia.com/gpu in the manifests, "
                        "number_of_gpu in its config.properties (default: 0, a CPU image)")
    return p.parse_args(argv)


def relative(out: Path) -> str:
    """The output folder as the Dockerfile names it: relative to the build context (the repository)."""
    out = out.resolve()
    return str(out.relative_to(REPO_ROOT)) if out.is_relative_to(REPO_ROOT) else str(out)


def generate(repo: Path, config: Path, out: Path, options: plan.PlanOptions, hpa_only: bool = False,
             gpus: int = 0) -> plan.Plan:
    """Read the inputs once, plan, write deploy/ (or just its HPA). Returns the plan."""
    found = gpu.on_gpu(inputs.load(repo, config, gpus))
    sized = plan.make_plan(found.mix, options)
    say(sized.explain(found.mix))
    if hpa_only and (out / "k8s").is_dir():
        say(f"[plan] wrote {k8s.write_hpa(out, found, sized)}")
        return sized
    out.mkdir(parents=True, exist_ok=True)
    rel = relative(out)
    for step, write in (("image", lambda: image.write(found, out, rel)),
                        ("k8s", lambda: k8s.write(out, found, sized)),
                        ("kserve", lambda: kserve.write(out, found))):
        say(f"[deploy] {step}: {len(write())} file(s) under {out / step if step != 'image' else out}")
    return sized


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if not args.check:
            options = plan.PlanOptions(rate_rps=args.rate, headroom=args.headroom,
                                       mix=None if args.mix is None else plan.parse_mix(args.mix))
            generate(REPO_ROOT, args.config, args.out, options, hpa_only=args.plan, gpus=args.gpus)
        validate.check(args.out, say)
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
