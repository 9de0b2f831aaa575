"""probust.demo.specs: the models the demo trains and scores, and the results folders' grid key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from probust import demo


def test_model_specs_train_the_family_and_score_pool_and_convergence_on_the_main_models(tmp_path):
    cfg = demo.config_for("fashion-mnist")
    specs = {s.name: s for s in demo.model_specs(cfg, tmp_path)}
    robust = f"fashion-mnist-cnn-robust1-sigma{cfg.robust_sigma:g}"
    assert set(specs) == {
        "fashion-mnist-linear",
        robust,
        *(f"fashion-mnist-cnn-lambda{v}" for v in ("0", "0.001", "0.01", "0.1")),
    }
    main_cnn = specs["fashion-mnist-cnn-lambda0"]
    assert len(main_cnn.requests) == 3  # main grid, pool, convergence
    assert main_cnn.requests[0].methods == demo.PAPER_METHODS
    assert main_cnn.requests[1].indices == "0-999" and main_cnn.requests[1].sigmas == (cfg.case_sigma,)
    assert main_cnn.requests[2].mmse_samples == (1, 2, 5, 10, 20, 50, 100)
    assert [r.kind for r in main_cnn.requests] == ["main", "pool", "convergence"]
    assert len(specs["fashion-mnist-cnn-lambda0.01"].requests) == 1
    assert specs["fashion-mnist-linear"].requests[1].mc_samples[-1] == 100_000
    # the checkpoint's name records what it was trained with, so other settings never reuse it
    assert str(specs["fashion-mnist-cnn-lambda0.01"].checkpoint).endswith("fashion-mnist-cnn-lambda0.01-e1-nall-s0.pt")


def test_robust_loss_cnns_are_trained_like_the_family_and_scored_on_its_grid(tmp_path):
    cfg = demo.config_for("fashion-mnist", robust_mus=(0.5, 2.0))
    specs = {s.name: s for s in demo.model_specs(cfg, tmp_path)}
    member = specs["fashion-mnist-cnn-lambda0.01"]
    for mu in ("0.5", "2"):
        s = specs[f"fashion-mnist-cnn-robust{mu}-sigma{cfg.robust_sigma:g}"]
        assert s.grad_reg == 0 and s.epochs == member.epochs and s.requests == member.requests
        assert dataclasses.asdict(s.robust) == {
            "mu": float(mu),
            "sigma": cfg.robust_sigma,
            "max_points": cfg.robust_max_points,
            "warmup": cfg.robust_warmup,
        }
        # the checkpoint's name records mu and sigma (the loss's other settings are checked when resuming)
        assert str(s.checkpoint).endswith(f"fashion-mnist-cnn-robust{mu}-sigma{cfg.robust_sigma:g}-e1-nall-s0.pt")
    assert cfg.robust_sigma in cfg.sigmas
    assert not any(s.robust for s in demo.model_specs(demo.config_for("fashion-mnist", robust_mus=()), tmp_path))
    quick = demo.config_for("fashion-mnist", quick=True)
    assert quick.robust_mus and quick.robust_sigma in quick.sigmas
    assert sum(bool(s.robust) for s in demo.model_specs(quick, tmp_path)) == 1


def test_the_main_cnn_and_the_robust_loss_cnns_are_certified_into_sibling_folders(tmp_path):
    cfg = demo.config_for("fashion-mnist", robust_mus=(0.5, 2.0))
    specs = demo.model_specs(cfg, tmp_path)
    certified = {s.name: s for s in specs if s.certify is not None}
    assert set(certified) == {"fashion-mnist-cnn-lambda0", *(s.name for s in specs if s.robust)}
    for s in specs:
        assert (s.certified is None) == (s.certify is None)
    for s in certified.values():
        # a sibling, not inside the estimate folder: a folder search stops at a results folder
        assert s.certified == tmp_path / "results" / f"{s.name}-certify"
        assert s.certify == demo.CertifyRequest("0-99", 0.4, 100, 5000, 0.001, "taylor")
    assert not any(s.certify for s in demo.model_specs(demo.config_for("fashion-mnist", certify_points=0), tmp_path))


def test_certify_key_clips_to_the_test_set_and_changes_with_the_model(tmp_path):
    cfg = demo.config_for("digits", quick=True)
    request = next(s.certify for s in demo.model_specs(cfg, tmp_path) if s.certify is not None)
    key = demo.certify_key(cfg, request, "ab" * 32, 5)
    assert key["certify"]["indices"] == "0-4" and key["certify"]["n"] == cfg.certify_n
    assert json.loads(json.dumps(key)) == key
    assert demo.certify_key(cfg, request, "cd" * 32, 5) != key


def test_model_specs_are_frozen_and_survive_pickling(tmp_path):
    import pickle

    for spec in demo.model_specs(demo.config_for("fashion-mnist"), tmp_path):
        assert pickle.loads(pickle.dumps(spec)) == spec
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.epochs = 2  # type: ignore[misc]


# -- the grid key is the one earlier versions wrote from plain dicts ------------------------------
# The oracle below is the spec and key code of probust 0.x's demo.py (before ModelSpec), verbatim
# but for names: a results folder it wrote must still be recognised, byte for byte.


def _old_slug(value: float) -> str:
    return "0" if value == 0 else f"{value:g}".replace("+", "")


def _old_model_specs(cfg: demo.DemoConfig, out: Path) -> list[dict[str, Any]]:
    PAPER_METHODS = ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax")
    FAMILY_METHODS = ("mc", "taylor", "mmse", "softmax")
    size = "all" if cfg.train_size is None else str(cfg.train_size)
    specs = []

    def spec(arch, lam, epochs, requests, cost, robust=None):
        name = f"{cfg.data}-{arch}" + (f"-lambda{_old_slug(lam)}" if arch == "cnn" and robust is None else "")
        if robust is not None:
            name += f"-robust{_old_slug(robust['mu'])}-sigma{_old_slug(robust['sigma'])}"
        ckpt = out / "models" / f"{name}-e{epochs}-n{size}-s{cfg.seed}.pt"
        return {
            "name": name,
            "arch": arch,
            "grad_reg": lam,
            "robust": robust,
            "epochs": epochs,
            "checkpoint": str(ckpt),
            "results": str(out / "results" / name),
            "requests": requests,
            "cost": cost,
        }

    main = {
        "indices": f"0-{cfg.points - 1}",
        "sigmas": list(cfg.sigmas),
        "mc_samples": [cfg.mc_samples],
        "mmse_samples": [cfg.mmse_samples],
    }
    conv_idx = f"0-{cfg.convergence_points - 1}"
    conv = {
        "indices": conv_idx,
        "sigmas": [cfg.case_sigma],
        "methods": ["mc", "mmse"],
        "mmse_samples": list(cfg.mmse_convergence),
    }
    lambdas = sorted(set(float(v) for v in cfg.lambdas) | {0.0})
    for lam in lambdas:
        requests = [{**main, "methods": list(PAPER_METHODS if lam == 0 else FAMILY_METHODS)}]
        cost = 1.0 + (0.5 if lam else 0.0)
        if lam == 0:
            requests.append(
                {
                    "indices": f"0-{cfg.pool_points - 1}",
                    "sigmas": [cfg.case_sigma],
                    "methods": ["mmse", "softmax"],
                    "mmse_samples": [cfg.mmse_samples],
                }
            )
            requests.append({**conv, "mc_samples": list(cfg.mc_convergence)})
            cost += 0.6
        specs.append(spec("cnn", lam, cfg.cnn_epochs, requests, cost))
    for mu in sorted(set(float(v) for v in cfg.robust_mus)):
        robust = {
            "mu": mu,
            "sigma": float(cfg.robust_sigma),
            "max_points": cfg.robust_max_points,
            "warmup": cfg.robust_warmup,
        }
        specs.append(spec("cnn", 0.0, cfg.cnn_epochs, [{**main, "methods": list(FAMILY_METHODS)}], 2.5, robust))
    specs.append(
        spec(
            "linear",
            0.0,
            cfg.linear_epochs,
            [{**main, "methods": list(PAPER_METHODS)}, {**conv, "mc_samples": list(cfg.mc_convergence_linear)}],
            0.4,
        )
    )
    return specs


def _old_grid_key(cfg: demo.DemoConfig, spec: dict[str, Any], model_sha: str, n_test: int) -> dict[str, Any]:
    requests = []
    for r in spec["requests"]:
        r = dict(r)
        first, last = (int(v) for v in r["indices"].split("-"))
        r["indices"] = f"{first}-{min(last, n_test - 1)}"
        requests.append(r)
    return {"model_sha256": model_sha, "seed": cfg.seed, "data": cfg.data, "requests": requests}


_CONFIGS = [
    ("fashion-mnist", {}),
    ("fashion-mnist", {"quick": True}),
    ("digits", {}),
    ("digits", {"quick": True}),
    ("mnist", {"points": 500, "seed": 7, "robust_mus": (0.5, 2.0, 0.5), "lambdas": (1e-2, 0.0, 1e-3)}),
    ("fashion-mnist", {"robust_mus": (), "train_size": 123, "sigmas": (0.2, 0.1), "mc_convergence": ()}),
]


@pytest.mark.parametrize("data, overrides", _CONFIGS)
@pytest.mark.parametrize("n_test", [10_000, 359, 25])
def test_grid_key_json_is_the_one_the_dict_specs_wrote(tmp_path, data, overrides, n_test):
    cfg = demo.config_for(data, **overrides)
    old, new = _old_model_specs(cfg, tmp_path), demo.model_specs(cfg, tmp_path)
    assert [s["name"] for s in old] == [s.name for s in new]
    for o, n in zip(old, new, strict=True):
        old_key = _old_grid_key(cfg, o, "ab" * 32, n_test)
        new_key = demo.grid_key(cfg, n, "ab" * 32, n_test)
        # the text of the grid file (key order included) and what a reader compares it with
        assert json.dumps(new_key, indent=1) == json.dumps(old_key, indent=1)
        assert json.loads(json.dumps(old_key, indent=1)) == new_key


@pytest.mark.parametrize("data, overrides", _CONFIGS)
def test_model_specs_carry_the_dict_specs_settings(tmp_path, data, overrides):
    cfg = demo.config_for(data, **overrides)
    for o, n in zip(_old_model_specs(cfg, tmp_path), demo.model_specs(cfg, tmp_path), strict=True):
        robust = None if n.robust is None else dataclasses.asdict(n.robust)
        assert (n.name, n.arch, n.grad_reg, robust, n.epochs, n.cost) == (
            o["name"],
            o["arch"],
            o["grad_reg"],
            o["robust"],
            o["epochs"],
            o["cost"],
        )
        assert (str(n.checkpoint), str(n.results)) == (o["checkpoint"], o["results"])
        assert [r.to_dict() for r in n.requests] == o["requests"]


def test_a_results_folder_written_with_the_dict_specs_is_recognised(tmp_path):
    cfg = demo.config_for("digits", quick=True)
    for o, n in zip(_old_model_specs(cfg, tmp_path), demo.model_specs(cfg, tmp_path), strict=True):
        grid_file = n.results / demo.GRID_FILE
        grid_file.parent.mkdir(parents=True)
        text = json.dumps(_old_grid_key(cfg, o, "cd" * 32, 359), indent=1) + "\n"
        grid_file.write_text(text)
        # the worker's test: json.loads(grid_file.read_text()) == grid
        assert json.loads(grid_file.read_text()) == demo.grid_key(cfg, n, "cd" * 32, 359)
        assert json.loads(grid_file.read_text()) != demo.grid_key(cfg, n, "ef" * 32, 359)
