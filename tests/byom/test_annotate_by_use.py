"""`annotate` recognises an embedding by use (the table the model indexes with its integer inputs), whatever its
name or width, and ranks the arrays it leaves unnamed by size with their share of the state, warning when one is
over 5% (replicated under every rule table). The model is a text classifier shaped like Flax's SST-2 example."""

import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.byom.test_annotate import cli, inside

MODELS = Path(__file__).parent / "models"
CONFIG = (
    "model: {_target_: sst2_linen.TextClassifier}\nmesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\n"
    "train: {steps: 2, batch_size: 8, seq_len: 16}\n"
)


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    root = tmp_path_factory.mktemp("sst2")
    shutil.copy(MODELS / "sst2_linen.py", root / "sst2_linen.py")
    (root / "sst2.yaml").write_text(CONFIG)
    with inside(root):
        result = cli("annotate", "sst2.yaml", "--out", "names.yaml")
    return root, result


def test_the_embedding_is_named_by_use_whatever_its_name_and_width(annotated):
    root, (code, _, stderr) = annotated
    assert code == 0, stderr
    rows = {
        pattern: names for pattern, names in YAML(typ="safe").load((root / "names.yaml").read_text())["annotations"]
    }
    assert rows["^params/lookup/table$"] == ["vocab", "embed"]  # 4000 x 64 under a 128-wide encoder
    assert rows["^params/encoder_out/bias$"] == ["embed"]  # the model's width is the encoder's, not the table's
    text = (root / "names.yaml").read_text()
    assert "# Sizes read off the model: embed 128, vocab 4000." in text
    assert (
        "vocab: 4000 rows the integer inputs index (an embedding table, by use); embed: the embedding's width 64"
        in text
    )


def test_unnamed_arrays_are_ranked_by_size_with_their_share_and_a_heavy_one_is_a_warning(annotated):
    root, (_, stdout, stderr) = annotated
    text = (root / "names.yaml").read_text()
    unnamed = text.split("# no rule of thumb names:\n", 1)[1].split("annotations:")[0].splitlines()
    assert unnamed == [
        "#   params/features (300, 77): 90.23 KiB, 7.6% of the state",
        "#   params/head/bias (2,): 8 B, 0.0% of the state",
    ]
    assert stderr.splitlines() == [
        "warning: params/features (300, 77) is unnamed and 7.6% of the state (90.23 KiB): every rule table "
        "replicates it; give it a row [regex, [names]]"
    ]
    assert stdout.startswith(
        "wrote names.yaml: 6 rows name 6 arrays; 3 dimensions left null (ambiguous), 2 arrays "
        "unnamed, 0 already named (the largest unnamed: params/features (300, 77): 90.23 KiB, "
        "7.6% of the state); extend your config with `base: names.yaml`"
    )
