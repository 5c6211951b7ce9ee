"""Chat / prompt_completion rows -> tokens and loss masks; packed rows; one-line errors naming file:line."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.data.chat import ChatTemplate
from partitioning.data.instruct import Examples, load_examples, load_instructions
from partitioning.data.packing import PackedBatches, pack

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"
MISTRAL = REPO / "tests" / "fixtures" / "chat" / "mistral"  # Mistral-7B-Instruct-v0.1's template, <s> / </s>


@pytest.fixture(scope="module")
def tok():
    return pt.data.load_tokenizer(LLAMA)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def conversation(user: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def test_chat_mask_is_exactly_the_assistant_tokens(tmp_path, tok):
    row = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "ok?"},
            {"role": "assistant", "content": "ok"},
        ]
    }
    template = ChatTemplate.from_dir(MISTRAL)
    ex = load_examples([write_jsonl(tmp_path / "c.jsonl", [row])], "chat", tok, template)
    tokens, mask = ex.example(0)
    full = template.render(row["messages"])
    assert full == "<s>[INST] hi [/INST]yo</s> [INST] ok? [/INST]ok</s> "
    assert tokens.tolist() == tok.tokenizer.encode(full, add_special_tokens=False).ids
    pieces = [tok.tokenizer.id_to_token(int(t)) for t in tokens]
    # The assistant's words and its end-of-turn </s>; not the space the template writes after it, nor anything else.
    on = [i for i in range(len(tokens)) if mask[i]]
    assert "".join(pieces[i] for i in on).replace("Ġ", " ") == "yo</s>ok</s>"
    first_yo = pieces.index("y") if "y" in pieces else pieces.index("yo")
    assert on[0] == first_yo and pieces[on[0] - 1] == "]"  # starts right after "[/INST]"
    assert mask.sum() == len(on) and ex.skipped_turns == 0


def test_train_on_prompt_counts_every_token(tmp_path, tok):
    f = write_jsonl(tmp_path / "c.jsonl", [conversation("hi", "yo")])
    ex = load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), train_on_prompt=True)
    assert ex.example(0)[1].tolist() == [1] * len(ex.example(0)[0])


def test_prompt_completion_mask(tmp_path, tok):
    f = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "2+2=", "completion": " 4"}])
    tokens, mask = load_examples([f], "prompt_completion", tok).example(0)
    head, answer = tok.encode("2+2=", document=False), tok.tokenizer.encode(" 4", add_special_tokens=False).ids
    assert tokens.tolist() == head + answer + [tok.stop_id]
    assert mask.tolist() == [0] * len(head) + [1] * (len(answer) + 1)


BAD_ROWS = [
    ('{"text": "hi"}', 'a chat row needs "messages": a non-empty list of {"role", "content"} (no messages key)'),
    ('{"messages": []}', 'a chat row needs "messages": a non-empty list of {"role", "content"} (messages is empty)'),
    ('{"messages": [{"content": "hi"}]}', 'message 0 needs a string "role" and "content" (no role)'),
    ('{"messages": [{"role": "user"}]}', 'message 0 needs a string "role" and "content" (no string content)'),
    (
        '{"messages": [{"role": "user", "content": "a"}',
        "not valid JSON (Expecting ',' delimiter: line 1 column 47 (char 46))",
    ),
    ("[1, 2]", "expected a JSON object per line, got list"),
]


@pytest.mark.parametrize("line, error", BAD_ROWS, ids=[e.split(" (")[0][:30] for _, e in BAD_ROWS])
def test_bad_chat_rows_name_file_and_line(tmp_path, tok, line, error):
    f = write_jsonl(tmp_path / "bad.jsonl", [conversation("a", "b"), "", line])
    with pytest.raises(pt.DataError) as e:
        load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL))
    assert str(e.value) == f"{f}:3: {error}"


def test_template_that_raises_names_template_and_row(tmp_path, tok):
    # Mistral v0.1's template refuses a system message: its raise_exception, one line with file:line.
    row = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    f = write_jsonl(tmp_path / "c.jsonl", [conversation("a", "b"), row])
    with pytest.raises(pt.DataError) as e:
        load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL))
    assert str(e.value) == (
        f"{f}:2: the chat template of {MISTRAL / 'tokenizer_config.json'} raised: "
        "Conversation roles must alternate user/assistant/user/assistant/..."
    )


def test_bad_prompt_completion_row(tmp_path, tok):
    f = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "a"}])
    with pytest.raises(
        pt.DataError,
        match=rf"^{f}:2: a prompt_completion row needs string \"prompt\" and "
        r"\"completion\" \(no completion key\)$",
    ):
        load_examples([f], "prompt_completion", tok)


def small_examples(lengths) -> Examples:
    offsets = np.cumsum([0, *lengths])
    tokens = np.arange(1, offsets[-1] + 1, dtype=np.int32)
    mask = (tokens % 2).astype(np.uint8)
    return Examples(tokens, mask, offsets.astype(np.int64), "demo")


def test_pack_next_fit_and_truncation():
    members, offsets = pack(np.array([5, 4, 30, 1, 3]), 8, np.arange(5))
    # slots: 4, 3, 8 (30 cut to 9 tokens), the 1-token example left out, 2: best fit, longest first
    assert [members[offsets[r] : offsets[r + 1]].tolist() for r in range(len(offsets) - 1)] == [[2], [0, 1], [4]]
    b = PackedBatches(small_examples([5, 4, 30, 1, 3]), 2, 8, seed=0)
    assert b.truncated == 1 and b.dropped == 1 and b.n_rows == 3
    assert b.note == (
        "data: 4 examples packed into 3 rows of 8 tokens: 70.8% of the slots hold tokens; 1 example longer "
        "than 9 tokens cut to that length (their end cut); 1 example of fewer than 2 tokens left out"
    )


def test_packed_rows_values():
    ex = small_examples([4, 3])  # tokens 1..4 and 5..7
    row = PackedBatches(ex, 1, 6, seed=0, packing=True).batch_at(0)
    seg = row["segment_ids"][0].tolist()
    first = 1 if row["inputs"][0, 0] == 1 else 5
    a = [1, 2, 3, 4] if first == 1 else [5, 6, 7]
    b = [5, 6, 7] if first == 1 else [1, 2, 3, 4]
    assert row["inputs"][0].tolist() == a[:-1] + b[:-1] + [0]
    assert row["targets"][0].tolist() == a[1:] + b[1:] + [0]
    assert seg == [1] * (len(a) - 1) + [2] * (len(b) - 1) + [0]
    assert row["positions"][0].tolist() == list(range(len(a) - 1)) + list(range(len(b) - 1)) + [0]
    assert row["loss_mask"][0].tolist() == [float(t % 2) for t in a[1:] + b[1:]] + [0.0]
    unpacked = PackedBatches(ex, 2, 6, seed=0, packing=False)
    assert unpacked.n_rows == 2 and set(unpacked.batch_at(0)["segment_ids"].max(1).tolist()) == {1}


def test_packed_batches_are_a_function_of_seed_and_step():
    ex = small_examples(list(np.random.default_rng(0).integers(2, 20, 200)))
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})
    sharding = jax.NamedSharding(mesh, jax.P(("data", "fsdp")))
    a, b = PackedBatches(ex, 8, 32, sharding, seed=3), PackedBatches(ex, 8, 32, seed=3)
    for step in (0, 5, 41):  # 41: a later epoch
        got, again = a.batch_at(step), b.batch_at(step)
        for k in got:
            np.testing.assert_array_equal(np.asarray(got[k]), again[k])
        assert got["inputs"].sharding == sharding
    other = PackedBatches(ex, 8, 32, seed=4).batch_at(0)
    assert not np.array_equal(other["inputs"], b.batch_at(0)["inputs"])
    # A process holding rows 4..8 builds only those rows, the same as the global batch's.
    rows = PackedBatches(ex, 8, 32, seed=3)
    rows_half = PackedBatches(ex, 8, 32, seed=3)
    from partitioning.data.order import ProcessRows, example_order
    from partitioning.data.packing import PackedRows

    half = ProcessRows(example_order(rows_half.n_rows, 3, "train"), 8, slice(4, 8)).map(
        PackedRows(ex, rows_half.members, rows_half.offsets, 32, slice(0, 32))
    )
    np.testing.assert_array_equal(half[7]["inputs"], rows.batch_at(7)["inputs"][4:])


def test_load_instructions_splits_and_describes(tmp_path):
    rows = [conversation(f"say {i}", f"{i} {i}") for i in range(20)]
    f = write_jsonl(tmp_path / "chat.jsonl", rows)
    corpus = load_instructions(str(f), "chat", str(LLAMA), chat_template=str(MISTRAL))
    assert (len(corpus.train), len(corpus.eval)) == (19, 1)
    assert corpus.describe().startswith(f"{f}: 19 train / 1 eval chat examples (")
    assert f"chat template {MISTRAL / 'tokenizer_config.json'})" in corpus.describe()
    with pytest.raises(pt.DataError, match="no chat template"):
        load_instructions(str(f), "chat", str(LLAMA))  # the llama fixture ships no template


def test_turns_a_template_rewrites_later_are_skipped_and_counted(tmp_path, tok):
    # Qwen3 renders the last assistant turn with an (empty) <think> block and earlier ones without:
    # the first turn fails the prefix test (not trained on, counted), the last is found.
    row = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"},
        ]
    }
    template = ChatTemplate.from_dir(REPO / "tests" / "fixtures" / "chat" / "qwen3")
    ex = load_examples([write_jsonl(tmp_path / "c.jsonl", [row])], "chat", tok, template)
    tokens, mask = ex.example(0)
    assert ex.skipped_turns == 1
    assert tok.tokenizer.decode(tokens[mask == 1].tolist(), skip_special_tokens=False) == (
        "<think>\n\n</think>\n\nd<|im_end|>"
    )
