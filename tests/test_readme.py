"""The README's taste of the API and the docs' five-minute tour run as written, and their printed output is true.

(The guides moved from the README to docs/; these tests read the pages that hold the snippets now.)
"""

import os
import re
import subprocess
import sys


def test_the_readme_taste_runs_as_pasted(repo, tmp_path):
    [block] = re.findall(r"```python\n(.*?)```", (repo / "README.md").read_text(), flags=re.S)
    (tmp_path / "taste.py").write_text(block)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    r = subprocess.run(
        [sys.executable, str(tmp_path / "taste.py")], capture_output=True, text=True, timeout=300, cwd=repo, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    printed = re.findall(r"^# (params/\S+ .*|\(.*\))$", block, flags=re.M)  # the comments showing the output
    assert printed and all(line in r.stdout for line in printed)


def test_tour_code_blocks_run(repo, tmp_path):
    text = (repo / "docs" / "index.md").read_text()
    tour = text.split("## Five-minute tour", 1)[1].split("### 4.", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", tour, flags=re.S)
    assert len(blocks) == 3
    script = "\n".join(blocks)
    script += "\nassert y.shape == (8, 64)\nprint('SPEC', params['params']['wi'].value.sharding.spec)\n"
    (tmp_path / "tour.py").write_text(script)
    # As pasted into a fresh shell: no device flags from the test run.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    r = subprocess.run(
        [sys.executable, str(tmp_path / "tour.py")], capture_output=True, text=True, timeout=300, cwd=repo, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # The comment in the README shows what the loop prints for params/wi.
    expected = re.search(r"# (params/wi .*)", tour).group(1)
    assert expected in r.stdout
    assert "SPEC P('fsdp', 'tensor')" in r.stdout
    assert "┘" in r.stdout  # visualize_array_sharding drew the unboxed param


def test_bring_your_own_model_example_runs(repo, tmp_path):
    section = (repo / "docs" / "byom.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    script = (
        "import os\nos.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'\n"
        + block
        + "\nprint('LOSS', float(metrics['loss']), trainer.state_shardings.params['wi'].spec)\n"
    )
    (tmp_path / "byom.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(
        [sys.executable, str(tmp_path / "byom.py")], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "P('fsdp', 'tensor')" in r.stdout and "LOSS " in r.stdout


def test_the_yaml_that_turns_on_pipeline_and_expert_parallelism_plans(repo, tmp_path):
    from partitioning.config import load_config
    from partitioning.config.planning import plan_from_config

    text = (repo / "docs" / "pipeline-experts.md").read_text()

    def first_yaml(title):
        return re.findall(r"```yaml\n(.*?)```", text.split(title, 1)[1].split("\n## ", 1)[0], flags=re.S)[0]

    small = ["train.batch_size=32", "train.seq_len=32"]
    pipe = tmp_path / "pp.yaml"
    pipe.write_text(
        "model: {name: gpt, embed: 64, heads: 4, mlp: 128, layers: 4}\n" + first_yaml("## Pipeline parallelism")
    )
    plan, _ = plan_from_config(load_config(pipe, small), devices=8)
    p = plan.parallel["pipeline"]
    assert (plan.mesh, p["stages"], p["microbatches"], plan.errors) == ({"stage": 4, "data": 2}, 4, 8, [])
    moe = tmp_path / "moe.yaml"
    moe.write_text(first_yaml("## Expert parallelism"))
    plan, _ = plan_from_config(load_config(moe, small), devices=8)
    e = plan.parallel["experts"]
    assert (plan.mesh, e["experts"], e["top_k"], e["expert_shards"], plan.errors) == (
        {"data": 1, "fsdp": 2, "expert": 4},
        8,
        2,
        4,
        [],
    )
    assert e["capacity"] == 10 and e["all_to_all_bytes"] > 0
