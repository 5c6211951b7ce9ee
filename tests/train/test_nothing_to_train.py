"""No run trains on nothing: instruction data whose loss would count no token is refused before the first step,
by `train` and `check` alike, in one line with its fix; heavy truncation is a warning with the numbers; a
message the template drops is named; a step (or an eval) that counts no token is never logged as loss 0."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from partitioning.data.instruct import load_instructions
from partitioning.train.loop import format_line
from partitioning.train.metrics import evaluate, without_empty_loss

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"
QWEN2 = REPO / "tests" / "fixtures" / "hf" / "qwen2"
MISTRAL = REPO / "tests" / "fixtures" / "chat" / "mistral"
QWEN2_TEMPLATE = REPO / "tests" / "fixtures" / "chat" / "qwen2"
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]


def config(hf: Path = LLAMA, seq_len: int = 64, extra: str = "") -> str:
    template = f"  chat_template: {MISTRAL if hf == LLAMA else QWEN2_TEMPLATE}\n"
    return (
        f"model: {{hf: {hf}, remat: none}}\nmesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}\nrules: fsdp\n"
        f"data:\n  format: chat\n  path: chat.jsonl\n{template}{extra}"
        f"train: {{steps: 2, batch_size: 8, seq_len: {seq_len}, eval_batches: 0, tracker: [jsonl]}}\n"
        "run_dir: runs/chat\n"
    )


def rows(n: int = 64, prompt_words: int = 80, user: str = "user", assistant: str = "assistant") -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "messages": [
                {"role": user, "content": " ".join(rng.choice(WORDS, prompt_words))},
                {"role": assistant, "content": " ".join(rng.choice(WORDS, 3))},
            ]
        }
        for _ in range(n)
    ]


def write(folder: Path, cfg: str, data: list[dict]) -> None:
    (folder / "run.yaml").write_text(cfg)
    (folder / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))


def lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip() and not x.startswith("simulating ")]


@pytest.fixture
def here(tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    load_instructions.cache_clear()
    yield tmp_path
    load_instructions.cache_clear()


def both_refuse(run, folder: Path) -> str:
    """`check` and `train` exit 2 with the same one line; nothing is written into the folder."""
    before = sorted(p.name for p in folder.iterdir())
    checked, trained = run("check", "run.yaml"), run("train", "run.yaml", "--no-progress")
    assert (checked.returncode, trained.returncode) == (2, 2), (checked.stderr, trained.stderr)
    assert lines(trained.stderr) == lines(checked.stderr)[:1] and len(lines(trained.stderr)) == 1, trained.stderr
    assert sorted(p.name for p in folder.iterdir()) == before  # the token cache lives elsewhere
    return lines(trained.stderr)[0]


def test_truncation_that_cuts_every_answer_is_refused_by_train_and_check(here, run_cli_in_process):
    write(here, config(), rows())
    line = both_refuse(run_cli_in_process, here)
    assert line == (
        "error: run.yaml:8: train.seq_len: chat.jsonl (train): the loss would count no token: 61 of 61 examples lost "
        "their whole answer at seq_len 64 (longest prompt 318 tokens); 100.0% of the answer tokens are cut; raise "
        "train.seq_len above 318, or set data.truncation: left"  # not drop: it would leave no example
    )


def test_drop_that_leaves_no_example_is_refused_with_what_would_work(here, run_cli_in_process):
    write(here, config(extra="  truncation: drop\n"), rows())
    assert both_refuse(run_cli_in_process, here) == (
        "error: run.yaml:9: train.seq_len: chat.jsonl (train): the loss would count no token: 61 of 61 examples are "
        "longer than seq_len 64 + 1 and left out; 100.0% of the answer tokens are cut; raise train.seq_len to 284 or "
        "more, or set data.truncation: left"
    )
    from partitioning.config import load_config
    from partitioning.config.build import dataset_from_config

    data = dataset_from_config(load_config("run.yaml"))  # the advice is the boundary: 284 keeps an example
    assert [data.loss_tokens("train", n).kept > 0 for n in (283, 284)] == [False, True]


def test_the_fixes_offered_are_those_that_keep_an_answer(here, run_cli_in_process):
    # Half the examples fit: dropping the long ones leaves the loss the short ones' answers, so drop is offered.
    write(here, config(extra="  truncation: right\n"), rows(32) + rows(32, 2))
    from partitioning.config import load_config
    from partitioning.config.build import dataset_from_config

    data = dataset_from_config(load_config("run.yaml"))
    assert [data.loss_tokens("train", 64, m).kept > 0 for m in ("right", "left", "drop")] == [True, True, True]
    write(here, config(extra="  truncation: right\n"), rows())
    data = dataset_from_config(load_config("run.yaml"))
    assert [data.loss_tokens("train", 64, m).kept > 0 for m in ("right", "left", "drop")] == [False, True, False]


def test_rows_without_an_assistant_turn_are_refused(here, run_cli_in_process):
    data = [{"messages": [{"role": "user", "content": "hi"}]} for _ in range(40)]
    write(here, config(), data)
    assert both_refuse(run_cli_in_process, here) == (
        "error: run.yaml:6: data.path: chat.jsonl (train): none of its 38 examples has a token for the loss to "
        "count: no row has an assistant turn or a completion (the loss counts only the answers; ShareGPT's human "
        "/ gpt roles are user / assistant; data.train_on_prompt: true counts every token)"
    )


def test_sharegpt_roles_the_template_drops_are_named_with_their_row(here, run_cli_in_process):
    # Qwen2's template renders only system / user / assistant / tool: `human` and `gpt` vanish without a word.
    write(here, config(QWEN2, 128), rows(40, 5, user="human", assistant="gpt"))
    assert both_refuse(run_cli_in_process, here) == (
        f"error: run.yaml:6: data.path: chat.jsonl:1: message 0 (role 'human') is not in the rendering of the chat "
        f"template of {QWEN2_TEMPLATE / 'tokenizer_config.json'}: the template leaves it out (a role it does not "
        "render? ShareGPT's human / gpt are user / assistant)"
    )


def test_heavy_truncation_is_a_warning_with_the_numbers_from_check_and_train(here, run_cli_in_process):
    data = rows(32) + rows(32, 2)  # half the examples lose their whole answer at seq_len 64, half fit
    write(here, config(), data)
    checked, trained = run_cli_in_process("check", "run.yaml"), run_cli_in_process("train", "run.yaml", "--no-progress")
    assert (checked.returncode, trained.returncode) == (0, 0), (checked.stderr, trained.stderr)
    warning = (
        "warning: data: chat.jsonl (train): 32 of 61 examples lost their whole answer at seq_len 64 (longest prompt "
        "318 tokens); 53.0% of the answer tokens are cut, more than data.max_truncated_answers 0.1 (truncation: "
        "right); raise train.seq_len, or set data.truncation: left or drop"
    )
    assert warning in lines(checked.stderr) and warning in lines(trained.stderr)
    note = "chat.jsonl (train): 61 examples packed into"
    assert note in checked.stdout and note in trained.stdout  # how the rows are cut: `check` says it too
    assert "32 examples longer than 65 tokens cut to that length (their end cut)" in checked.stdout


def test_left_truncation_keeps_the_answers_and_trains(here, run_cli_in_process):
    write(here, config(extra="  truncation: left\n"), rows())
    r = run_cli_in_process("train", "run.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    assert "61 examples longer than 65 tokens cut to that length (their start cut)" in r.stdout
    records = [json.loads(x) for x in Path("runs/chat/metrics.jsonl").read_text().splitlines()]
    assert all(rec["loss_tokens"] > 0 and rec["loss"] > 0 for rec in records)


def test_a_step_that_counts_no_token_has_no_loss():
    host = {"step": 3, "loss": 0.0, "accuracy": 0.0, "loss_tokens": 0.0, "grad_norm": 0.0}
    assert without_empty_loss(host) == {"step": 3, "loss_tokens": 0.0, "grad_norm": 0.0}
    assert format_line(without_empty_loss(host), 10) == "step 3/10  loss -  loss_tokens 0  grad_norm 0"


def test_an_eval_weighs_batches_by_their_tokens_and_one_without_any_has_no_loss():
    class Trainer:
        def __init__(self, results):
            self.results = iter(results)

        def eval_step(self, state, batch):
            return next(self.results)

    two = [{"loss": 1.0, "accuracy": 1.0, "loss_tokens": 30.0}, {"loss": 4.0, "accuracy": 0.0, "loss_tokens": 10.0}]
    got = evaluate(Trainer(two), None, [0, 1])
    assert got == {"eval_loss": 1.75, "eval_accuracy": 0.75, "eval_loss_tokens": 20.0}
    none = [{"loss": 0.0, "accuracy": 0.0, "loss_tokens": 0.0}] * 2
    assert evaluate(Trainer(none), None, [0, 1]) == {"eval_loss_tokens": 0.0}


def test_check_shows_tokenizing_progress_as_train_does_and_no_progress_quiets_it(here, run_cli_in_process, monkeypatch):
    from partitioning.data import progress

    monkeypatch.setattr(progress, "DELAY_S", 0.0)  # as if tokenizing took more than a second
    monkeypatch.setattr(progress, "_terminal", lambda stream: False)  # lines, not a bar
    write(here, config(), rows(64, 5))
    shown = run_cli_in_process("check", "run.yaml")
    assert shown.returncode == 0, shown.stderr
    said = [x for x in lines(shown.stderr) if x.startswith("data: ")]
    assert said[0].startswith("data: tokenizing chat.jsonl (0.0 MB): ") and said[-1].startswith("data: 64 examples, ")
    load_instructions.cache_clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(here / "cache"))  # tokenized again, quietly
    quiet = run_cli_in_process("check", "run.yaml", "--no-progress")
    assert quiet.returncode == 0 and not [x for x in lines(quiet.stderr) if x.startswith("data: ")], quiet.stderr
