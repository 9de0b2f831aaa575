"""probust.models: the paper's architectures, the registry, and every way of loading a model."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probust.models as pm


def _inputs(shape, batch=3, seed=0):
    return torch.rand((batch, *shape), generator=torch.Generator().manual_seed(seed))


# ---- architectures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, shape",
    [
        ("linear", (1, 28, 28)),
        ("linear", (3, 32, 32)),
        ("cnn", (1, 28, 28)),
        ("cnn", (1, 8, 8)),
        ("cnn", (3, 32, 32)),
        ("resnet18", (3, 32, 32)),
        ("resnet18", (1, 28, 28)),
    ],
)
def test_every_arch_maps_a_batch_to_logits(arch, shape):
    torch.manual_seed(0)
    model = pm.build(arch, num_classes=7, input_shape=shape).eval()
    out = model(_inputs(shape))
    assert out.shape == (3, 7) and out.dtype == torch.float32 and torch.isfinite(out).all()


def test_cnn_has_the_papers_layers_on_28x28():
    model = pm.build("cnn", 10, (1, 28, 28))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(c.out_channels, c.kernel_size, c.padding) for c in convs] == [(10, (5, 5), (0, 0)), (20, (5, 5), (0, 0))]
    assert [(fc.in_features, fc.out_features) for fc in linears] == [(320, 50), (50, 10)]
    # conv1 260 + conv2 5020 + fc1 16050 + fc2 510 weights and biases
    assert sum(p.numel() for p in model.parameters()) == 21_840


def test_cnn_uses_same_padding_for_8x8_digits():
    model = pm.build("cnn", 10, (1, 8, 8))
    assert pm.cnn_padding((1, 8, 8)) == 2 and pm.cnn_padding((1, 16, 16)) == 0
    assert [m.in_features for m in model.modules() if isinstance(m, nn.Linear)][0] == 20 * 2 * 2
    with pytest.raises(ValueError, match="at least 4x4"):
        pm.build("cnn", 10, (1, 3, 3))


@pytest.mark.parametrize("shape, features", [((1, 28, 28), 20 * 20 * 20), ((1, 8, 8), 20 * 8 * 8)])
def test_cnn_without_pooling_keeps_the_layer_list(shape, features):
    model = pm.build("cnn", 10, shape, pool=False)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert [m.in_features for m in model.modules() if isinstance(m, nn.Linear)] == [features, 50]
    assert model(_inputs(shape)).shape == (3, 10)
    assert set(model.state_dict()) == set(pm.build("cnn", 10, shape).state_dict())


def test_cnn_dropout_acts_only_in_training():
    torch.manual_seed(0)
    plain = pm.build("cnn", 10, (1, 28, 28))
    dropped = pm.build("cnn", 10, (1, 28, 28), dropout=0.5)
    dropped.load_state_dict(plain.state_dict())  # same keys: dropout layers hold no weights
    x = _inputs((1, 28, 28))
    assert torch.equal(dropped.eval()(x), plain.eval()(x))
    assert not torch.equal(dropped.train()(x), plain.train()(x))


def test_linear_model_is_one_affine_map_of_the_pixels():
    model = pm.build("linear", 10, (1, 28, 28), mean=[0.25], std=[0.5]).eval()
    assert len([m for m in model.modules() if isinstance(m, nn.Linear)]) == 1
    x = _inputs((1, 28, 28))
    expected = ((x - 0.25) / 0.5).flatten(1) @ model.fc.weight.T + model.fc.bias
    assert torch.allclose(model(x), expected, atol=1e-5)


def test_resnet18_has_a_cifar_stem_and_normalises_inside():
    mean, std = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
    model = pm.build("resnet18", 10, (3, 32, 32), mean=mean, std=std).eval()
    conv1 = model.net.conv1
    assert (conv1.kernel_size, conv1.stride, conv1.padding) == ((3, 3), (1, 1), (1, 1))
    assert isinstance(model.net.maxpool, nn.Identity)
    x = _inputs((3, 32, 32), batch=2)
    manual = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert torch.allclose(model(x), model.net(manual), atol=1e-5)


def test_normalisation_statistics_travel_in_the_state_dict():
    model = pm.build("cnn", 10, (1, 28, 28), mean=[0.286], std=[0.353])
    state = model.state_dict()
    assert torch.allclose(state["normalize.mean"].flatten(), torch.tensor([0.286]))
    assert torch.allclose(state["normalize.std"].flatten(), torch.tensor([0.353]))
    with pytest.raises(ValueError, match="std must be positive"):
        pm.Normalize([0.0], [0.0], channels=1)


def test_unknown_arch_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown architecture 'vgg'; known architectures: linear, cnn, resnet18, vit"):
        pm.build("vgg")


# ---- probust checkpoints ----------------------------------------------------------------------


@pytest.mark.parametrize("arch, shape", [("linear", (1, 28, 28)), ("cnn", (1, 8, 8)), ("resnet18", (3, 32, 32))])
def test_checkpoint_round_trip_gives_identical_outputs(tmp_path, arch, shape):
    torch.manual_seed(1)
    model = pm.build(arch, 10, shape, mean=[0.5] * shape[0], std=[0.2] * shape[0]).eval()
    path = tmp_path / "m.pt"

    pm.save_checkpoint(path, model, {"dataset": "digits", "grad_reg": 1e-3})
    loaded, meta = pm.load_model(path)

    x = _inputs(shape)
    assert torch.equal(loaded(x), model(x)) and not loaded.training
    assert (meta["arch"], meta["num_classes"], meta["input_shape"]) == (arch, 10, list(shape))
    assert meta["dataset"] == "digits" and meta["grad_reg"] == 1e-3
    assert meta["probust_version"] and meta["created"]
    assert json.loads(pm.sidecar_path(path).read_text()) == meta


def test_checkpoint_is_replaced_atomically_or_not_at_all(tmp_path, monkeypatch):
    model = pm.build("linear", 10, (1, 8, 8))
    path = tmp_path / "m.pt"
    pm.save_checkpoint(path, model, {"dataset": "digits"})
    before = path.read_bytes()

    def dies_mid_write(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(OSError, match="disk full"):
        pm.save_checkpoint(path, model, {"dataset": "digits", "epoch": 2})

    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m.pt", "m.pt.json"]  # no temporary file left


def test_mismatched_checkpoint_is_refused_naming_the_mismatch(tmp_path):
    path = tmp_path / "m.pt"
    pm.save_checkpoint(path, pm.build("cnn", 100, (3, 32, 32)), {"dataset": "cifar100"})

    with pytest.raises(pm.CheckpointMismatchError, match="num_classes is 100, expected 10"):
        pm.load_model(path, expect_num_classes=10)
    with pytest.raises(pm.CheckpointMismatchError, match="arch is cnn, expected resnet18"):
        pm.load_model(path, expect_arch="resnet18")
    with pytest.raises(pm.CheckpointMismatchError, match=r"input_shape is \[3, 32, 32\], expected \[1, 28, 28\]"):
        pm.load_model(path, expect_input_shape=(1, 28, 28))
    with pytest.raises(pm.CheckpointMismatchError, match="dataset is cifar100, expected cifar10"):
        pm.load_model(path, expect_dataset="CIFAR-10")
    pm.load_model(path, expect_num_classes=100, expect_input_shape=[3, 32, 32], expect_dataset="cifar-100")


def test_weights_that_do_not_fit_the_recorded_arch_are_refused(tmp_path):
    path = tmp_path / "m.pt"
    pm.save_checkpoint(path, pm.build("cnn", 10, (1, 28, 28)), {})
    payload = torch.load(path, weights_only=True)
    payload["meta"]["num_classes"] = 5
    torch.save(payload, path)

    with pytest.raises(pm.CheckpointError, match="do not fit the recorded architecture 'cnn'"):
        pm.load_model(path)


def test_save_checkpoint_refuses_models_it_cannot_rebuild(tmp_path):
    with pytest.raises(pm.CheckpointError, match="torch.export"):
        pm.save_checkpoint(tmp_path / "m.pt", nn.Linear(3, 2), {})


# ---- other model files ------------------------------------------------------------------------


def _user_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()


def test_torchscript_file_round_trips(tmp_path):
    model = _user_model()
    path = tmp_path / "m.ts"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(model), str(path))

    loaded, meta = pm.load_model(path, expect_num_classes=5, expect_input_shape=(1, 8, 8))

    x = _inputs((1, 8, 8), batch=4)
    assert torch.allclose(loaded(x), model(x), atol=1e-6)
    assert meta["format"] == "torchscript"
    with pytest.raises(pm.CheckpointMismatchError, match="num_classes is 5, expected 10"):
        pm.load_model(path, expect_num_classes=10, expect_input_shape=(1, 8, 8))
    with pytest.raises(pm.CheckpointMismatchError, match="does not accept inputs of shape"):
        pm.load_model(path, expect_input_shape=(3, 32, 32))


def test_torch_export_file_round_trips_with_dynamic_batch(tmp_path):
    model = _user_model()
    path = tmp_path / "m.pt2"
    program = torch.export.export(model, (_inputs((1, 8, 8), 2),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, str(path))

    loaded, meta = pm.load_model(path, expect_num_classes=5)

    assert meta["input_shape"] == [1, 8, 8] and meta["batch_size"] == "dynamic"
    loaded.train()
    loaded.eval()  # estimators switch modes; an exported module alone would raise here
    for batch in (1, 5):
        x = _inputs((1, 8, 8), batch, seed=batch)
        assert torch.allclose(loaded(x), model(x), atol=1e-6)
    x = _inputs((1, 8, 8)).requires_grad_(True)
    (grad,) = torch.autograd.grad(loaded(x)[:, 0].sum(), x)
    x_ref = x.detach().requires_grad_(True)
    (grad_ref,) = torch.autograd.grad(model(x_ref)[:, 0].sum(), x_ref)
    assert torch.allclose(grad, grad_ref, atol=1e-6)


def test_torch_export_file_with_fixed_batch_accepts_any_batch(tmp_path):
    model = _user_model()
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, (_inputs((1, 8, 8), 4),)), str(path))

    loaded, meta = pm.load_model(path)

    assert meta["batch_size"] == 4
    x = _inputs((1, 8, 8), 7)
    assert torch.allclose(loaded(x), model(x), atol=1e-6)


def test_pickled_module_loads_only_when_allowed(tmp_path):
    model = _user_model()
    path = tmp_path / "m.pt"
    torch.save(model, path)

    with pytest.raises(pm.CheckpointError, match="allow_pickle=True"):
        pm.load_model(path)
    loaded, meta = pm.load_model(path, allow_pickle=True)
    x = _inputs((1, 8, 8))
    assert torch.equal(loaded(x), model(x)) and meta["format"] == "pickled module"


def test_bare_state_dict_is_refused_with_advice(tmp_path):
    path = tmp_path / "sd.pt"
    torch.save(pm.build("cnn").state_dict(), path)
    with pytest.raises(pm.CheckpointError, match="bare state_dict.*save_checkpoint"):
        pm.load_model(path)


def test_garbage_and_missing_files_are_reported(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"\x00\x01 definitely not a model")
    with pytest.raises(pm.CheckpointError, match="not a model file"):
        pm.load_model(tmp_path / "junk.pt")
    with pytest.raises(FileNotFoundError, match="no model file"):
        pm.load_model(tmp_path / "absent.pt")


# ---- ViT (optional extra) ---------------------------------------------------------------------

TINY_VIT = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}


def test_vit_builds_from_a_small_config_offline_and_round_trips(tmp_path):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = pm.build("vit", 10, (1, 28, 28), config={**TINY_VIT, "patch_size": 7}).eval()
    x = _inputs((1, 28, 28))
    assert model(x).shape == (3, 10)

    path = tmp_path / "vit.pt"
    pm.save_checkpoint(path, model, {"dataset": "fashion-mnist"})
    loaded, meta = pm.load_model(path, expect_num_classes=10)

    assert meta["arch_kwargs"]["config"]["patch_size"] == 7
    assert torch.allclose(loaded(x), model(x), atol=1e-6)


def test_vit_fine_tunes_a_pretrained_checkpoint_from_a_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(**TINY_VIT, image_size=16, patch_size=4, num_channels=3, num_labels=3)
    pretrained = transformers.ViTForImageClassification(config)
    pretrained.save_pretrained(tmp_path / "vit-pretrained")

    model = pm.build("vit", 10, (3, 32, 32), pretrained=str(tmp_path / "vit-pretrained")).eval()

    assert model.vit.classifier.out_features == 10  # a new head for the new classes
    assert torch.equal(
        model.vit.vit.embeddings.patch_embeddings.projection.weight,
        pretrained.vit.embeddings.patch_embeddings.projection.weight,
    )
    x = _inputs((3, 32, 32), 2)
    manual = F.interpolate((x - 0.5) / 0.5, size=(16, 16), mode="bilinear", align_corners=False)
    assert torch.allclose(model(x), model.vit(pixel_values=manual).logits, atol=1e-5)
    path = tmp_path / "ft.pt"
    pm.save_checkpoint(path, model, {})
    loaded, _ = pm.load_model(path)  # rebuilt from the recorded config, no folder needed
    assert torch.allclose(loaded(x), model(x), atol=1e-6)
