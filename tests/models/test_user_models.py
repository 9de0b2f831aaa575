"""The mlp architecture, models built from a user's factory and weights, and the check that a
model's output is logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from probust import models


def test_the_mlp_standardises_each_feature_inside_the_model_and_survives_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    mean, std = torch.tensor([1.0, -2.0, 10.0]), torch.tensor([0.5, 2.0, 4.0])
    net = models.build("mlp", 4, (3,), mean=mean.tolist(), std=std.tolist(), hidden=[5])
    x = torch.randn(6, 3)
    first, last = net.net[0], net.net[2]
    by_hand = last(torch.relu(first((x - mean) / std)))
    torch.testing.assert_close(net(x), by_hand, rtol=0, atol=0)
    path = models.save_checkpoint(tmp_path / "m.pt", net, {"dataset": "t.csv"})
    loaded, meta = models.load_model(path, expect_num_classes=4, expect_input_shape=(3,))
    assert meta["arch"] == "mlp" and torch.equal(loaded(x), net(x))


def test_the_mlp_takes_any_input_shape_and_per_channel_statistics():
    net = models.build("mlp", 2, (2, 3, 3), mean=[0.5, 0.25], std=[2.0, 4.0])
    x = torch.rand(4, 2, 3, 3)
    stats = torch.tensor([0.5, 0.25]).view(2, 1, 1), torch.tensor([2.0, 4.0]).view(2, 1, 1)
    expected = net.net(((x - stats[0]) / stats[1]).flatten(1))
    assert torch.equal(net(x), expected)
    with pytest.raises(ValueError, match="mean must have 1, 2 or 18 values, got 3"):
        models.build("mlp", 2, (2, 3, 3), mean=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="for 'cnn', got \\(13,\\); mlp takes flat inputs"):
        models.build("cnn", 2, (13,))


def test_weights_load_strictly_into_a_factory_model(tmp_path, monkeypatch):
    (tmp_path / "probust_user_models_mod.py").write_text(
        "from torch import nn\ndef make():\n    return nn.Linear(3, 2)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert models.is_factory("probust_user_models_mod:make") and not models.is_factory("model.pt")
    source = nn.Linear(3, 2)
    torch.save(source.state_dict(), tmp_path / "w.pt")
    built = models.build_from_factory("probust_user_models_mod:make")
    models.load_weights(built, tmp_path / "w.pt")
    assert torch.equal(built.weight, source.weight) and torch.equal(built.bias, source.bias)
    torch.save(nn.Linear(4, 2).state_dict(), tmp_path / "other.pt")
    with pytest.raises(models.CheckpointError, match="other.pt: the weights do not fit the model: .*size mismatch"):
        models.load_weights(built, tmp_path / "other.pt")
    torch.save({"w": [1, 2]}, tmp_path / "junk.pt")
    with pytest.raises(models.CheckpointError, match="junk.pt: holds a dict, expected a state_dict"):
        models.load_weights(built, tmp_path / "junk.pt")


def test_the_model_contract_reads_logits_a_model_output_and_a_tuple_and_describes_anything_else():
    from transformers.modeling_outputs import ImageClassifierOutput

    logits = torch.tensor([[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]])
    assert models.output_problem(logits, 2) is None
    assert models.output_problem(ImageClassifierOutput(logits=logits), 2) is None
    assert models.output_problem({"logits": logits, "aux": 1}, 2) is None
    assert models.output_problem((logits, 3), 2) is None
    assert models.output_problem(torch.softmax(logits, 1), 2).startswith("returns probabilities")
    assert models.output_problem((torch.softmax(logits, 1), 3), 2).startswith("returns probabilities")
    scores = models.output_problem({"scores": logits}, 2)
    assert "returns a dict (keys 'scores') without 'logits'" in scores and "e.g. out['scores']" in scores
    assert "returns a tuple ([2], [2, 3]) whose first item is not logits" in models.output_problem(
        (logits[:, 0], logits), 2
    )
    assert "e.g. out[1]" in models.output_problem((logits[:, 0], logits), 2)
    assert models.output_problem(logits[0], 2) == "returns [3] for a batch of 2, expected logits [B, C] = [2, classes]"
    assert "at least 2 classes" in models.output_problem(logits[:, :1], 2)
    assert "returns a str" in models.output_problem("logits", 2)
