"""`specdec demo image` on the shipped digit pair, and the PNG grid writer."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from specdec.cli import main
from specdec.cli.image_grid import render_grid, text_mask, write_png
from specdec.zoo.images import IMAGE_PAIR

shipped = pytest.mark.skipif(not (IMAGE_PAIR / "target" / "config.json").is_file(), reason="image pair not shipped")


def read_png(path) -> np.ndarray:
    """Decode the 8-bit RGB, filter-0 PNGs `write_png` makes (enough to check them)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2)
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8).reshape(height, 1 + 3 * width)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(height, width, 3)


def test_grid_png_round_trips(tmp_path):
    ink = np.full((8, 8), 16)
    blank = np.zeros((8, 8), dtype=int)
    blank[0, 0] = -1  # not a pixel token: drawn red
    rgb = render_grid([("PLAIN T=0", [ink, blank]), ("SPEC T=0", [blank, ink])], 17, column_titles=["0", "1"])
    back = read_png(write_png(tmp_path / "g.png", rgb))
    assert np.array_equal(back, rgb)
    assert (back == 0).all(-1).any()  # full ink is black
    assert ((back == (220, 30, 30)).all(-1)).sum() == 2 * 8 * 8  # the blank image twice, one red pixel, 8× scaled
    assert text_mask("T=1").shape == (10, 24)


def test_grid_rejects_empty_rows(tmp_path):
    with pytest.raises(ValueError, match="rows"):
        render_grid([], 17)
    with pytest.raises(ValueError, match="rgb"):
        write_png(tmp_path / "x.png", np.zeros((4, 4), dtype=np.uint8))


@shipped
def test_demo_image_json_is_identical_and_writes_the_grid(capsys, tmp_path):
    out = tmp_path / "grid.png"
    code = main(["demo", "image", "--json", "--classes", "3", "7", "--samples", "1", "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    summary = json.loads(cap.out.strip().splitlines()[-1])
    assert summary["identical"] is True
    assert 0.3 < summary["alpha"] <= 1.0 and summary["mean_accepted_length"] > 1.0
    assert summary["speedup"] > 0 and summary["sampled"]["alpha"] > 0
    assert summary["generated_tokens"] == 2 * 64
    assert 0 <= summary["invalid_pixels"] <= 8  # T = 1 rarely samples a non-pixel token (drawn red)
    assert summary["png"] == str(out.resolve())
    grid = read_png(out)
    assert grid.shape[0] > 4 * 64 and grid.shape[1] > 2 * 64  # 4 rows (greedy, sampled × plain, spec), 2 columns


@shipped
def test_demo_image_human_output_and_bad_arguments(capsys, tmp_path):
    assert main(["demo", "image", "--classes", "1", "--samples", "0", "--out", str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    assert "identical: yes" in out and "speedup" in out and "PNG grid" in out
    assert main(["demo", "image", "--classes", "12"]) == 2
    assert "--classes" in capsys.readouterr().err
    assert main(["demo", "image", "--num-draft-tokens", "0"]) == 2
