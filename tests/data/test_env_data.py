import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roll_ma.data import MathDataset, generate_arithmetic, gsm8k_final_answer, load_math_records

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A big sum?", "answer": "It is 1,200 in total.\n#### 1,200"},
]
MATH_ROWS = [
    {"problem": "What is $1/2$ as a decimal?", "answer": "0.5", "solution": "..."},
    {"problem": "Simplify $\\sqrt{12}$.", "answer": "2\\sqrt{3}", "solution": "..."},
]


def _write(tmp_path, rows, fmt):
    path = tmp_path / f"data.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        path.write_text(json.dumps(rows))
    return str(path)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "json"])
def test_presets(tmp_path, fmt):
    gsm = load_math_records(_write(tmp_path, GSM8K_ROWS, fmt), preset="gsm8k")
    assert gsm == [
        {"problem": GSM8K_ROWS[0]["question"], "answer": "7"},
        {"problem": GSM8K_ROWS[1]["question"], "answer": "1200"},
    ]
    for preset in ("deepscaler", "math500", "MATH-500"):
        records = load_math_records(_write(tmp_path, MATH_ROWS, fmt), preset=preset)
        assert records == [{"problem": r["problem"], "answer": r["answer"]} for r in MATH_ROWS]


def test_json_layouts_and_overrides(tmp_path):
    columnar = tmp_path / "c.json"
    columnar.write_text(json.dumps({"q": ["1+1", "2+2"], "a": [2, 4]}))
    assert load_math_records(str(columnar), problem_key="q", answer_key="a") == [
        {"problem": "1+1", "answer": "2"},
        {"problem": "2+2", "answer": "4"},
    ]
    wrapped = tmp_path / "w.json"
    wrapped.write_text(json.dumps({"data": MATH_ROWS}))
    assert len(load_math_records(str(wrapped), limit=1)) == 1


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_math_records(str(tmp_path / "missing.parquet"), preset="gsm8k")
    path = _write(tmp_path, MATH_ROWS, "parquet")
    with pytest.raises(ValueError) as e:
        load_math_records(path, preset="gsm8k")
    msg = str(e.value)
    assert "'question'" in msg and "problem, answer, solution" in msg and "problem_key=" in msg
    with pytest.raises(ValueError, match="answer_key="):
        load_math_records(path, answer_key="final")
    with pytest.raises(ValueError, match="Unknown data preset"):
        load_math_records(path, preset="aime")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=":2: not valid JSON"):
        load_math_records(str(bad))
    other = tmp_path / "data.csv"
    other.write_text("problem,answer\n1+1,2\n")
    with pytest.raises(ValueError, match="Unsupported"):
        load_math_records(str(other))


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("work\n#### 72") == "72"
    assert gsm8k_final_answer("#### -3.5") == "-3.5"
    assert gsm8k_final_answer("#### 1,000,000") == "1000000"
    assert gsm8k_final_answer("no marker 5") == "no marker 5"


def test_synthetic_levels():
    assert generate_arithmetic(50, level=2, seed=1) == generate_arithmetic(50, level=2, seed=1)
    assert generate_arithmetic(50, level=2, seed=1) != generate_arithmetic(50, level=2, seed=2)
    for level in range(1, 6):
        for record in generate_arithmetic(300, level=level, seed=level):
            text, answer = record["problem"], int(record["answer"])
            assert answer >= 0 and " " not in text
            numbers = [int(x) for x in text.replace("+", " ").replace("-", " ").replace("*", " ").split()]
            if level == 1:
                assert all(n < 10 for n in numbers) and "*" not in text
            if level == 2:
                assert all(10 <= n < 100 for n in numbers) and "*" not in text
            if level == 3 and "*" in text:
                assert all(n < 10 for n in numbers)
            assert answer == _evaluate(text)
    assert any("*" in r["problem"] for r in generate_arithmetic(100, level=3))
    with pytest.raises(ValueError):
        generate_arithmetic(1, level=9)


def _evaluate(text):
    """Independent check: + - * with precedence, for the test only."""
    terms, sign = [], 1
    for token in text.replace("-", " - ").replace("+", " + ").split():
        if token in "+-":
            sign = 1 if token == "+" else -1
        else:
            value = 1
            for factor in token.split("*"):
                value *= int(factor)
            terms.append(sign * value)
    return sum(terms)


def test_dataset_epochs_cursor_and_resume():
    records = [{"problem": str(i), "answer": str(i)} for i in range(10)]
    ds = MathDataset(records, seed=3)
    first_epoch = [r["problem"] for r in ds.next_batch(10)]
    assert sorted(first_epoch) == [str(i) for i in range(10)] and first_epoch != sorted(first_epoch)
    assert [int(x) for x in first_epoch] == ds.epoch_order(0)
    batch = ds.next_batch(4)
    assert ds.epoch == 1 and [r["problem"] for r in batch] == [str(i) for i in ds.epoch_order(1)[:4]]
    state = ds.state_dict()
    expected = [r["problem"] for r in ds.next_batch(13)]  # spans into epoch 2
    resumed = MathDataset(records, seed=3)
    resumed.load_state_dict(state)
    assert [r["problem"] for r in resumed.next_batch(13)] == expected
    assert MathDataset(records, seed=3).epoch_order(5) == ds.epoch_order(5)
    assert MathDataset(records, seed=4).epoch_order(0) != ds.epoch_order(0)
    assert MathDataset(records, shuffle=False).next_batch(3) == records[:3]
    with pytest.raises(ValueError, match="same data"):
        MathDataset(records[:5]).load_state_dict(state)


def test_dataset_from_file_and_synthetic(tmp_path):
    ds = MathDataset.from_file(_write(tmp_path, GSM8K_ROWS, "jsonl"), preset="gsm8k", seed=0)
    assert len(ds) == 2 and {r["answer"] for r in ds.next_batch(2)} == {"7", "1200"}
    syn = MathDataset.from_synthetic(20, level=1, seed=0)
    assert len(syn) == 20 and syn.next_batch(1)[0]["problem"]
