"""`python -m engine.bench peer` end to end on the tiny model, llama.cpp stood in for by a fake interpreter:
every GGUF of --peer-ggufs runs as its own peer beside the bundled one, in the same rounds, and a missing
file is one clear error before anything loads."""

import json
import sys

import pytest
from conftest import build_tiny_model_dir

from engine.bench import main


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory, tokenizer):
    """The tiny model with room for the bench's ~1,400-token conversation."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-long"), tokenizer, max_position_embeddings=2048)


def _fake_llama(tmp_path):
    """A stand-in for the llama-cpp-python venv's python: it answers each job with figures read from its
    GGUF's name (decode tok/s 10 for the bundled file, else the number in the name) and logs the file."""
    log = tmp_path / "ggufs"
    fake = tmp_path / "python"
    fake.write_text(f"""#!{sys.executable}
import json, sys
job = json.load(sys.stdin)
open({str(log)!r}, "a").write(job["gguf"] + "\\n")
rate = float(job["gguf"].rsplit("-", 1)[-1].split(".")[0]) if "fake-" in job["gguf"] else 10.0
row = {{"ttft_ms": 100.0, "decode_tps": rate, "cpu_ms_per_token": 50.0, "tokens": 4}}
print(json.dumps({{"version": "fake", "short": row, "long": row, "warm": row}}))
""")
    fake.chmod(0o755)
    return fake, log


def test_each_peer_gguf_is_its_own_llama_cpp_peer_in_the_same_rounds(long_tiny, tmp_path, capsys):
    fake, log = _fake_llama(tmp_path)
    ggufs = [tmp_path / "fake-20.gguf", tmp_path / "fake-40.gguf"]
    for g in ggufs:
        g.write_bytes(b"GGUF")
    argv = ["peer", "--model", str(long_tiny), "--dtype", "fp32", "--threads", "1", "--peer-python", str(fake),
            "--peer-ggufs", ",".join(map(str, ggufs)), "--rounds", "2", "--max-tokens", "4", "--warm-tokens", "2",
            "--json"]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    result = json.loads(printed[-1])
    table = result["table"]
    assert table["llama.cpp"]["decode_tps_short"] == 10.0  # the bundled GGUF, still the ratio's peer
    assert table["llama.cpp fake-20"]["decode_tps_short"] == 20.0 and table["llama.cpp fake-40"]["decode_tps_short"] == 40.0
    assert result["ratio"] == pytest.approx(table[result["best"]]["decode_tps_short"] / 10.0, rel=1e-3)
    runs = log.read_text().splitlines()  # two rounds, each peer once a round
    assert len(runs) == 6 and len(set(runs)) == 3 and [runs.count(str(g)) for g in ggufs] == [2, 2]
    assert any(line.startswith(f"ours ({result['best']}) ÷ llama.cpp fake-40") for line in printed)


def test_a_missing_peer_gguf_is_one_clear_error(tiny_model_dir, tmp_path, capsys):
    fake, log = _fake_llama(tmp_path)
    argv = ["peer", "--model", str(tiny_model_dir), "--peer-python", str(fake), "--peer-ggufs",
            str(tmp_path / "nowhere.gguf")]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "--peer-ggufs: no GGUF file at" in err and "nowhere.gguf" in err and not log.exists()
