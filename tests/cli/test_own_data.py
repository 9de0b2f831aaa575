"""``probust estimate`` on a user's own data, noise and model, through the command line, on files
written here: tensor files, tables, image folders, factories with weights, TorchScript; the
noise flags against closed forms; resumption and refusal of changed data or noise."""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from scipy.stats import norm
from torch import nn

from probust import models
from probust.cli import main
from probust.run.reading import read_config, read_results
from tests._helpers import save_tiny_vit

NETS = """
import torch
from torch import nn


class _Out(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.kind = kind

    def forward(self, x):
        z = self.fc(x)
        if self.kind == "dict":
            return {"scores": z}
        if self.kind == "tuple":
            return z.sum(1), z
        return torch.softmax(z, dim=1)


def linear1():
    return nn.Linear(1, 2)


def linear2():
    return nn.Linear(2, 2)


def as_dict():
    return _Out("dict")


def as_tuple():
    return _Out("tuple")


def as_probabilities():
    return _Out("probabilities")


def not_a_module():
    return 3
"""


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """A folder holding the factories module ``probust_test_nets`` and weights for them."""
    folder = tmp_path_factory.mktemp("nets")
    (folder / "probust_test_nets.py").write_text(NETS)
    one = nn.Linear(1, 2)
    two = nn.Linear(2, 2)
    with torch.no_grad():
        one.weight.copy_(torch.tensor([[1.0], [-1.0]]))
        one.bias.zero_()
        two.weight.copy_(torch.tensor([[1.0, -2.0], [0.0, 0.0]]))
        two.bias.copy_(torch.tensor([0.3, 0.0]))
    torch.save(one.state_dict(), folder / "one.pt")
    torch.save(two.state_dict(), folder / "two.pt")
    yield folder
    sys.modules.pop("probust_test_nets", None)


def estimate(*args: str) -> int:
    return main(["estimate", "--device", "cpu", "--quiet", *args])


def one_line_error(capsys, *parts: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("probust estimate: error: "), err
    for part in parts:
        assert part in err, err
    return err


def two_feature_table(path):
    x = np.array([[0.1, 0.3], [-0.4, 0.2], [0.5, -0.1], [0.05, 0.05], [1.0, 0.9], [-0.2, -0.6]])
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "label": [0, 1, 0, 1, 0, 1]})
    frame.to_parquet(path)
    return x


def linear2_p(x, sigma, cov):
    """p_robust of linear2 under N(0, cov * sigma^2): Phi(|g| / sqrt(u^T S u)) with g = f_0 - f_1."""
    u = np.array([1.0, -2.0])
    g = x @ u + 0.3
    return norm.cdf(np.abs(g) / (sigma * np.sqrt(u @ cov @ u)))


def test_gaussian_noise_shapes_reach_the_estimator_and_are_recorded(nets, tmp_path, monkeypatch):
    monkeypatch.chdir(nets)
    x = two_feature_table(tmp_path / "t.parquet")
    np.save(tmp_path / "m.npy", np.array([1.0, 3.0]))
    cov = np.array([[1.0, 0.5], [0.5, 2.0]])
    np.save(tmp_path / "c.npy", cov)
    spread = x.std(axis=0)  # over every point of the data set
    cases = {
        "iso": ([], np.eye(2)),
        "std": (["--noise-std", str(tmp_path / "m.npy")], np.diag([1.0, 9.0])),
        "cov": (["--noise-cov", str(tmp_path / "c.npy")], cov),
        "scale": (["--noise-scale", "std"], np.diag(spread**2)),
    }
    for name, (flags, covariance) in cases.items():
        out = tmp_path / name
        args = ["--data", str(tmp_path / "t.parquet"), "--model", "probust_test_nets:linear2"]
        args += ["--weights", str(nets / "two.pt"), "--sigma", "0.2", "0.5", "--methods", "taylor", "--out", str(out)]
        assert estimate(*args, *flags) == 0
        df = read_results(out).sort_values(["sigma", "index"])
        for sigma in (0.2, 0.5):
            got = df[df["sigma"] == sigma]["p"].to_numpy()
            np.testing.assert_allclose(got, linear2_p(x, sigma, covariance), atol=2e-6)
        noise = read_config(out)["run"]["noise"]
        assert noise["kind"] == "gaussian"
    assert "std" in read_config(tmp_path / "std")["run"]["noise"]
    assert read_config(tmp_path / "cov")["run"]["noise"]["cov"]["shape"] == [2, 2]
    assert read_config(tmp_path / "scale")["run"]["noise"]["scale"] == "std"
    assert read_config(tmp_path / "iso")["run"]["noise"] == {"kind": "gaussian"}
    assert read_config(tmp_path / "iso")["model"]["source"] == "factory:probust_test_nets:linear2"


def test_uniform_and_laplace_noise_match_their_closed_forms(nets, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(nets)
    xs = np.array([0.2, -0.05, 0.3, -0.6, 0.1])
    pd.DataFrame({"f": xs, "label": (xs < 0).astype(int)}).to_csv(tmp_path / "t.csv", index=False)
    sigma = 0.2
    closed = {
        "uniform": np.minimum(1.0, 0.5 + np.abs(xs) / (2 * math.sqrt(3) * sigma)),
        "laplace": 1 - 0.5 * np.exp(-np.abs(xs) / (sigma / math.sqrt(2))),
    }
    for kind, p in closed.items():
        out = tmp_path / kind
        args = ["--data", str(tmp_path / "t.csv"), "--model", "probust_test_nets:linear1", "--weights"]
        args += [str(nets / "one.pt"), "--sigma", str(sigma), "--methods", "mc", "--mc-samples", "20000"]
        assert estimate(*args, "--noise", kind, "--confidence", "0.999", "--out", str(out)) == 0
        df = read_results(out).sort_values("index")
        assert ((df["ci_low"].to_numpy() <= p) & (p <= df["ci_high"].to_numpy())).all(), (kind, df["p"], p)
        # and Gaussian noise of the same sigma would not fit: the noise really changed
        gaussian = norm.cdf(abs(xs[0]) / sigma)
        assert not df["ci_low"].iloc[0] <= gaussian <= df["ci_high"].iloc[0]
        assert read_config(out)["run"]["noise"] == {"kind": kind}
    # the same folder refuses another noise, and mc_cv refuses non-Gaussian noise
    assert estimate(*args, "--noise", "uniform", "--confidence", "0.999", "--out", str(tmp_path / "laplace")) == 2
    one_line_error(capsys, "holds results of a different run (noise: {'kind': 'laplace'} there, {'kind': 'uniform'}")
    assert estimate(*args[:-4], "--methods", "mc_cv", "--noise", "uniform", "--out", str(tmp_path / "cv")) == 2
    one_line_error(capsys, "--noise: mc_cv needs Gaussian noise", "got --noise uniform; use mc")


def write_images(root, values):
    """PNG images root/<class>/<i>.png from {class: [uint8 arrays]}."""
    for name, arrays in values.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i, a in enumerate(arrays):
            Image.fromarray(a, mode="L").save(root / name / f"{i}.png")


def test_an_image_folder_and_a_torchscript_file_resume_and_refuse_changed_images(tmp_path, capsys):
    rng = np.random.default_rng(0)
    values = {c: [rng.integers(0, 256, (8, 8), dtype=np.uint8) for _ in range(4)] for c in ("cat", "dog")}
    write_images(tmp_path / "pics", values)
    torch.manual_seed(0)
    net = models.build("linear", 2, (1, 8, 8)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated; users still have such files
        torch.jit.save(torch.jit.trace(net, torch.zeros(1, 1, 8, 8)), tmp_path / "net.ts")
    out = tmp_path / "r"
    args = ["--data", str(tmp_path / "pics"), "--model", str(tmp_path / "net.ts"), "--sigma", "0.1"]
    args += ["--methods", "mc", "taylor", "softmax", "--mc-samples", "50", "--out", str(out)]
    assert estimate(*args) == 0
    config = read_config(out)
    assert config["data"]["classes"] == ["cat", "dog"] and config["data"]["details"]["format"] == "image-folder"
    assert config["run"]["dataset"] == "pics" and config["data"]["input_shape"] == [1, 8, 8]
    df = read_results(out)
    assert sorted(df.drop_duplicates("index")["label"]) == [0] * 4 + [1] * 4
    # taylor on a linear model is exact: Phi(|g| / (sigma |u|)) from the images read independently
    x = torch.stack([torch.from_numpy(a).float()[None] / 255 for c in ("cat", "dog") for a in values[c]])
    with torch.no_grad():
        logits = net(x).double()
    u = (net.fc.weight[0] - net.fc.weight[1]).double().norm()
    oracle = norm.cdf((logits[:, 0] - logits[:, 1]).abs().numpy() / (0.1 * u.item()))
    taylor = df[df["method"] == "taylor"].sort_values("index")["p"].to_numpy()
    np.testing.assert_allclose(taylor, oracle, atol=1e-5)
    # the same command resumes: nothing to compute
    assert main(["estimate", "--device", "cpu", *args]) == 0
    assert "(24 already there, 0 computed)" in capsys.readouterr().err
    # one changed pixel: the folder holds results of other data
    values["dog"][2][0, 0] ^= 1
    write_images(tmp_path / "pics", values)
    assert estimate(*args) == 2
    one_line_error(capsys, "holds results of a different run (data_sha256:")


def test_a_tensor_file_resumes_and_refuses_changed_labels(tmp_path, capsys):
    torch.manual_seed(1)
    x = torch.rand(10, 1, 8, 8)
    y = torch.arange(10) % 3
    np.savez(tmp_path / "d.npz", images=x.numpy(), targets=y.numpy(), classes=np.array(["a", "b", "c"]))
    model = models.save_checkpoint(tmp_path / "m.pt", models.build("linear", 3, (1, 8, 8)), {})
    out = tmp_path / "r"
    args = ["--data", str(tmp_path / "d.npz"), "--x-key", "images", "--y-key", "targets", "--model", str(model)]
    args += ["--sigma", "0.1", "--methods", "softmax", "--out", str(out)]
    assert estimate(*args) == 0
    assert read_config(out)["data"]["classes"] == ["a", "b", "c"]
    assert read_results(out).sort_values("index")["label"].tolist() == y.tolist()
    assert estimate(*args) == 0
    np.savez(tmp_path / "d.npz", images=x.numpy(), targets=(y + 1).numpy() % 3, classes=np.array(["a", "b", "c"]))
    assert estimate(*args) == 2
    one_line_error(capsys, "data_sha256:")


@pytest.mark.parametrize(
    ("write", "flags", "parts"),
    [
        (
            lambda p: pd.DataFrame({"f": [1.0, 2.0], "city": ["x", "y"], "label": [0, 1]}).to_csv(p / "t.csv"),
            ["--data", "{p}/t.csv"],
            ["--data: {p}/t.csv: feature columns must be numbers; 'city' is not", "--feature-columns NAMES"],
        ),
        (
            lambda p: pd.DataFrame({"f": [1.0, np.nan], "label": [0, 1]}).to_parquet(p / "t.parquet"),
            ["--data", "{p}/t.parquet"],
            ["{p}/t.parquet: NaN or infinite feature values in 1 rows (columns 'f')"],
        ),
        (
            lambda p: pd.DataFrame({"f": [1.0, 2.0], "y": [0, 1]}).to_csv(p / "t.csv", index=False),
            ["--data", "{p}/t.csv"],
            ["no label column 'label' (the default); name it with --label-column NAME; its columns: f, y"],
        ),
        (
            lambda p: np.savez(p / "d.npz", x=np.zeros((2, 3)), y=np.array([0.0, 2.5])),
            ["--data", "{p}/d.npz"],
            ["{p}/d.npz: labels 'y' must be whole numbers (class indices); point 1 has 2.5"],
        ),
        (
            lambda p: np.savez(p / "d.npz", x=np.zeros((2, 3)), y=np.array([0, 1])),
            ["--data", "{p}/d.npz", "--label-column", "y"],
            ["--label-column: does not apply to a .npz file"],
        ),
        (
            lambda p: write_images(p / "pics", {"a": [np.zeros((4, 4), np.uint8)], "b": [np.zeros((5, 4), np.uint8)]}),
            ["--data", "{p}/pics"],
            ["images of mixed sizes", "pass --image-size N to resize them"],
        ),
        (
            lambda p: (p / "pics" / "a").mkdir(parents=True) or (p / "pics" / "a" / "x.png").write_bytes(b"no"),
            ["--data", "{p}/pics"],
            ["{p}/pics/a/x.png: not a readable image"],
        ),
        (lambda p: (p / "pics").mkdir(), ["--data", "{p}/pics"], ["needs one subfolder per class"]),
        (lambda p: None, ["--data", "{p}/gone.csv"], ["gone.csv: no such file or folder, and not a built-in data set"]),
    ],
)
def test_bad_data_is_one_line_naming_the_file_and_the_problem(tmp_path, capsys, write, flags, parts):
    write(tmp_path)
    model = tmp_path / "m.pt"
    models.save_checkpoint(model, models.build("mlp", 2, (3,)), {})
    flags = [f.format(p=tmp_path) for f in flags]
    assert estimate(*flags, "--model", str(model), "--sigma", "0.1", "--out", str(tmp_path / "r")) == 2
    one_line_error(capsys, *[part.format(p=tmp_path) for part in parts])


@pytest.mark.parametrize(
    ("factory", "weights", "parts"),
    [
        ("as_dict", None, ["--model: returns a dict (keys 'scores') without 'logits'", "out['scores']"]),
        ("as_tuple", None, ["--model: returns a tuple ([2], [2, 2]) whose first item is not logits", "e.g. out[1]"]),
        ("as_probabilities", None, ["--model: returns probabilities", "remove the final softmax", "torch.log"]),
        ("not_a_module", None, ["--model: probust_test_nets:not_a_module: not_a_module() returned a int"]),
        ("missing", None, ["--model: probust_test_nets:missing: probust_test_nets has no attribute 'missing'"]),
        ("linear2", "one.pt", ["--weights: ", "one.pt: the weights do not fit the model"]),
    ],
)
def test_a_model_that_is_not_a_logits_classifier_is_refused_saying_how_to_wrap_it(
    nets, tmp_path, monkeypatch, capsys, factory, weights, parts
):
    monkeypatch.chdir(nets)
    two_feature_table(tmp_path / "t.parquet")
    extra = ["--untrained"] if weights is None else ["--weights", str(nets / weights)]
    args = ["--data", str(tmp_path / "t.parquet"), "--model", f"probust_test_nets:{factory}", *extra]
    assert estimate(*args, "--sigma", "0.1", "--out", str(tmp_path / "r")) == 2
    one_line_error(capsys, *parts)


def test_weights_need_a_factory_and_a_factory_module_must_import(nets, tmp_path, monkeypatch, capsys):
    two_feature_table(tmp_path / "t.parquet")
    model = models.save_checkpoint(tmp_path / "m.pt", models.build("mlp", 2, (2,)), {})
    base = ["--data", str(tmp_path / "t.parquet"), "--sigma", "0.1", "--out", str(tmp_path / "r")]
    assert estimate(*base, "--model", str(model), "--weights", str(nets / "two.pt")) == 2
    one_line_error(capsys, "--weights: apply to a model given as package.module:function only")
    assert estimate(*base, "--model", "no_such_module_here:make") == 2
    one_line_error(capsys, "--model: no_such_module_here:make: cannot import no_such_module_here")


def test_the_tabular_tutorial_runs_end_to_end_and_the_report_skips_image_only_experiments(tmp_path, capsys):
    from sklearn.datasets import load_wine

    wine = load_wine(as_frame=True)
    frame = wine.frame.copy()
    frame["target"] = [str(wine.target_names[i]) for i in wine.target]
    test = frame.iloc[::4]  # the rows are sorted by class: every class is in both parts
    frame.drop(test.index).to_parquet(tmp_path / "train.parquet", index=False)
    test.to_parquet(tmp_path / "test.parquet", index=False)
    mlp = tmp_path / "mlp.pt"
    train = ["train", "--data", str(tmp_path / "train.parquet"), "--test-data", str(tmp_path / "test.parquet")]
    train += ["--label-column", "target", "--arch", "mlp", "--epochs", "30", "--out", str(mlp), "--quiet"]
    assert main([*train, "--threads", "1"]) == 0
    out = tmp_path / "wine_results"
    args = ["--data", str(tmp_path / "test.parquet"), "--label-column", "target", "--model", str(mlp)]
    args += ["--sigma", "0.05", "0.2", "--noise-scale", "std", "--methods", "mc", "mmse", "softmax"]
    assert estimate(*args, "--mc-samples", "500", "--out", str(out)) == 0
    config = read_config(out)
    assert config["data"]["classes"] == ["class_0", "class_1", "class_2"]
    assert config["data"]["details"]["features"][:2] == ["alcohol", "malic_acid"]
    df = read_results(out)
    assert (df["prediction"] == df["label"]).mean() > 0.8  # the MLP learnt the wine classes
    report = ["report", str(out), "--out", str(tmp_path / "rep"), "--quiet"]
    assert main([*report, "--only", "class_bias", "vulnerable_points", "case_study"]) == 0
    html = (tmp_path / "rep" / "report.html").read_text()
    reason = "an image-only experiment, and the points of &#x27;test.parquet&#x27; scored by"
    assert reason in html and "are not images (input shape [13]" in html
    assert list((tmp_path / "rep").rglob("class_bias*.csv"))  # the experiments that can, ran
    assert not list((tmp_path / "rep").rglob("vulnerable_points*.csv"))
    assert "class_0, class_1, class_2" in html and "gaussian, σ × each coordinate" in html  # the configuration


def test_a_hugging_face_image_classifier_folder_is_scored_with_its_normalisation_inside(tmp_path, capsys):
    import json

    hf = save_tiny_vit(tmp_path / "vit", num_channels=1)
    capsys.readouterr()
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5], "image_std": [0.25]}))
    x = torch.rand(6, 1, 8, 8)
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=np.array([0, 1, 2, 0, 1, 2]))
    out = tmp_path / "r"
    args = ["--data", str(tmp_path / "d.npz"), "--model", f"hf:{tmp_path / 'vit'}", "--sigma", "0.05"]
    assert estimate(*args, "--methods", "softmax", "taylor", "--out", str(out)) == 0
    df = read_results(out)
    with torch.no_grad():
        logits = hf(pixel_values=(x - 0.5) / 0.25).logits.double()
    softmax = df[df["method"] == "softmax"].sort_values("index")
    np.testing.assert_array_equal(softmax["prediction"].to_numpy(), logits.argmax(1).numpy())
    np.testing.assert_allclose(softmax["p"].to_numpy(), torch.softmax(logits, 1).max(1).values.numpy(), atol=1e-6)
    assert read_config(out)["model"]["meta"]["model_type"] == "vit"
    assert capsys.readouterr().err == ""  # --quiet: no progress bar from transformers either
    assert (
        estimate("--data", str(tmp_path / "d.npz"), "--model", f"hf:{tmp_path}", "--sigma", "0.1", "--out", str(out))
        == 2
    )
    one_line_error(capsys, "--model: ", "not a Hugging Face model folder (no config.json")


def test_a_hugging_face_datasets_folder_is_refused_with_what_to_do(tmp_path, capsys):
    (tmp_path / "hfdata").mkdir()
    for name in ("dataset_info.json", "state.json"):
        (tmp_path / "hfdata" / name).write_text("{}")
    model = models.save_checkpoint(tmp_path / "m.pt", models.build("mlp", 2, (3,)), {})
    args = ["--data", str(tmp_path / "hfdata"), "--model", str(model), "--sigma", "0.1", "--out", str(tmp_path / "r")]
    assert estimate(*args) == 2
    one_line_error(capsys, "a Hugging Face datasets folder (save_to_disk) is not read", "to_parquet")


def test_integer_inputs_are_refused_as_probust_certify_refuses_them(tmp_path, capsys):
    # sigma is in the units of the tensors the model receives: pixels stored as 0..255 would take
    # sigma in pixel steps, silently, where the model was trained on [0, 1].
    model = models.save_checkpoint(tmp_path / "m.pt", models.build("mlp", 3, (1, 4, 4)), {})
    x = np.random.default_rng(0).integers(0, 256, size=(6, 1, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "pixels.npz", x=x, y=np.arange(6) % 3)
    args = ["--model", str(model), "--sigma", "0.1", "--methods", "softmax", "--out", str(tmp_path / "r")]
    assert estimate("--data", str(tmp_path / "pixels.npz"), *args) == 2
    one_line_error(
        capsys, "--data: ", "pixels.npz) are uint8, not floating point", "store them as float32 scaled to [0, 1]"
    )
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())  # refused before any work
    np.savez(tmp_path / "scaled.npz", x=(x / 255).astype(np.float32), y=np.arange(6) % 3)
    assert estimate("--data", str(tmp_path / "scaled.npz"), *args) == 0
