"""Build the featurizer bundles the corpus loads: ``documents/v2/artifacts/{rot,pca,sae}.safetensors``.

    .venv/bin/python scripts/build_artifacts.py

Each is made by running this project on the shipped ``tiny-llama``, so a bundle
is what a researcher's own run would have saved, header included:

- ``rot.safetensors``: ``documents/v2/das.causalab.json`` run as written; its
  weights step's bundle (the fitted rotation).
- ``pca.safetensors``: ``documents/v2/pca_harvest.causalab.json`` run as written;
  the ``reduce: pca`` basis it saves.
- ``sae.safetensors``: a sparse autoencoder (SAELens names and orientations,
  ReLU, untied) trained briefly on the model's own residual stream leaving
  layer 1 — every token of the weekdays_full/train prompts, harvested by a
  document run through the same engine — not random weights called an SAE. Its
  latents are ordered by mean activation at the prompts' last token (where the
  corpus reads and writes), most active first, so a document that ablates
  latent 0 ablates the one most on where the answer is made.

Seeded and single-threaded: a rerun writes the same tensors.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import causalab_mini as cm  # noqa: E402
from causalab_mini.outputs.write import safetensors_bytes, write  # noqa: E402

V2 = ROOT / "documents" / "v2"
ARTIFACTS = ROOT / "documents" / "v2" / "artifacts"
SAE_LATENTS = 64
SAE_STEPS = 3000
SAE_L1 = 3e-2


def run_document(path: Path, raw: dict, out: Path) -> Path:
    plan = cm.run(cm.read(raw, path=path), engine="nnterp").plan
    write(plan, out, plan.provenance)
    return out


def harvest_document() -> dict:
    """Every token's residual stream leaving layer 1, over both weekdays_full splits, kept unreduced."""
    das = json.loads((V2 / "das.causalab.json").read_text())
    rows = {"base": "weekdays_full/train"}
    return {
        "header": {"description": "SAE training activations (scripts/build_artifacts.py)."},
        "model": das["model"],
        "roles": {"base": {"field": "input"}},
        "sites": {"target": das["sites"]["target"]},
        "interventions": {"harvest": {"reads": {
            "acts": {"site": "target", "pos": {"all": True}, "input": "base"},
            "last": {"site": "target", "pos": -1, "input": "base"}}}},
        "steps": {
            "train": {"kind": "observe", "interventions": "harvest", "rows": rows,
                      "outputs": {"vectors": "acts", "final": "last"},
                      "saves": [{"value": "vectors", "file_path": "train.safetensors"},
                                {"value": "final", "file_path": "final.safetensors"}]},
            "test": {"kind": "observe", "interventions": "harvest", "rows": {"base": "weekdays_full/test"},
                     "outputs": {"held_out": "acts"}, "saves": [{"value": "held_out", "file_path": "test.safetensors"}]},
        },
    }


def train_sae(acts: torch.Tensor, rank_on: torch.Tensor) -> dict:
    """ReLU SAE, untied, L1 on the latents; decoder rows kept at unit norm (the usual constraint)."""
    torch.manual_seed(0)
    d = acts.shape[1]
    b_dec = torch.nn.Parameter(acts.mean(0).clone())
    w_dec = torch.nn.Parameter(torch.nn.functional.normalize(torch.randn(SAE_LATENTS, d), dim=1))
    w_enc = torch.nn.Parameter(w_dec.detach().T.clone())
    b_enc = torch.nn.Parameter(torch.zeros(SAE_LATENTS))
    opt = torch.optim.Adam([w_enc, b_enc, w_dec, b_dec], lr=3e-3)
    for step in range(SAE_STEPS):
        f = torch.relu((acts - b_dec) @ w_enc + b_enc)
        recon = f @ w_dec + b_dec
        mse = (recon - acts).pow(2).sum(1).mean()
        loss = mse + SAE_L1 * f.abs().sum(1).mean() * w_dec.norm(dim=1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            w_dec.data = torch.nn.functional.normalize(w_dec.data, dim=1)
    with torch.no_grad():
        on_final = torch.relu((rank_on - b_dec) @ w_enc + b_enc)
        order = torch.argsort(on_final.mean(0), descending=True, stable=True)
        f = torch.relu((acts - b_dec) @ w_enc + b_enc)
        explained = 1 - ((f @ w_dec + b_dec) - acts).pow(2).sum() / (acts - acts.mean(0)).pow(2).sum()
        alive = int((f > 0).any(0).sum())
        l0 = float((f > 0).float().sum(1).mean())
    print(f"sae: {SAE_LATENTS} latents, {alive} alive, L0 {l0:.1f}, variance explained {explained:.3f} "
          f"on {acts.shape[0]} training vectors")
    return {"W_enc": w_enc.detach()[:, order].contiguous(), "b_enc": b_enc.detach()[order].contiguous(),
            "W_dec": w_dec.detach()[order].contiguous(), "b_dec": b_dec.detach().contiguous()}


def main() -> None:
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, saved, target in (("das", "rot.safetensors", "rot.safetensors"),
                                    ("pca_harvest", "pca.safetensors", "pca.safetensors")):
            path = V2 / f"{name}.causalab.json"
            out = run_document(path, json.loads(path.read_text()), tmp / name)
            (ARTIFACTS / target).write_bytes((out / saved).read_bytes())
            print(f"{target}: from {path.relative_to(ROOT)}")

        harvest = harvest_document()
        out = run_document(V2 / "harvest.causalab.json", harvest, tmp / "harvest")
        train = load_file(out / "train.safetensors")["vectors"].float()
        from safetensors import safe_open

        with safe_open(str(out / "train.safetensors"), "pt") as fh:
            header = dict(fh.metadata())
        final = load_file(out / "final.safetensors")["final"].float().reshape(-1, train.shape[1])
        sae = train_sae(train, final)
        test = load_file(out / "test.safetensors")["held_out"].float()
        with torch.no_grad():
            f = torch.relu((test - sae["b_dec"]) @ sae["W_enc"] + sae["b_enc"])
            explained = 1 - ((f @ sae["W_dec"] + sae["b_dec"]) - test).pow(2).sum() / (test - test.mean(0)).pow(2).sum()
        print(f"sae: variance explained {explained:.3f} on {test.shape[0]} held-out vectors")
        meta = {**header, "kind": "sae", "k": str(SAE_LATENTS), "produced_by": "scripts/build_artifacts.py"}
        (ARTIFACTS / "sae.safetensors").write_bytes(safetensors_bytes(sae, sorted(meta.items())))
        print("sae.safetensors: trained on the harvested activations")


if __name__ == "__main__":
    main()
