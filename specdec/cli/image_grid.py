"""A labelled PNG grid of small grey images, written with the standard library only (zlib + struct).

`render_grid(rows, levels)` lays out one row of images per label (ink dark on white, as scikit-learn
shows the digits; a pixel that was not a pixel token is red) with the label drawn in a 3×5 pixel font,
and a header of column titles; `write_png(path, rgb)` encodes an `[H, W, 3]` uint8 array. No Pillow or
matplotlib, so `specdec demo image` runs on a bare install.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# 3 columns × 5 rows per glyph, row by row, "#" = ink; unknown characters draw as a space
_GLYPHS = {
    "A": ".#.#.#####.##.#", "B": "##.#.###.#.###.", "C": ".###..#..#...##", "D": "##.#.##.##.###.",
    "E": "####..##.#..###", "F": "####..##.#..#..", "G": ".###..#.##.#.##", "H": "#.##.#####.##.#",
    "I": "###.#..#..#.###", "J": "..#..#..##.#.#.", "K": "#.##.###.#.##.#", "L": "#..#..#..#..###",
    "M": "#.########.##.#", "N": "##.#.##.##.##.#", "O": ".#.#.##.##.#.#.", "P": "##.#.###.#..#..",
    "Q": ".#.#.##.###..##", "R": "##.#.###.#.##.#", "S": ".###...#...###.", "T": "###.#..#..#..#.",
    "U": "#.##.##.##.####", "V": "#.##.##.##.#.#.", "W": "#.##.########.#", "X": "#.##.#.#.#.##.#",
    "Y": "#.##.#.#..#..#.", "Z": "###..#.#.#..###", "0": "####.##.##.####", "1": ".#.##..#..#.###",
    "2": "##...#.#.#..###", "3": "##...#.#...###.", "4": "#.##.####..#..#", "5": "####..##...###.",
    "6": ".###..####.####", "7": "###..#.#..#..#.", "8": "####.#####.####", "9": "####.####..###.",
    "=": "...###...###...", ".": ".............#.", "-": "......###......", ":": "....#.....#....",
    "#": "#.#####.#####.#",
}
GLYPH_W, GLYPH_H = 3, 5


def _glyph(ch: str) -> np.ndarray:
    bits = _GLYPHS.get(ch.upper(), "." * GLYPH_W * GLYPH_H)
    return np.array([c == "#" for c in bits], dtype=bool).reshape(GLYPH_H, GLYPH_W)


def text_mask(text: str, scale: int = 2) -> np.ndarray:
    """`[5·scale, 4·scale·len(text)]` bool mask of `text` in the 3×5 font (one blank column between glyphs)."""
    cells = [np.pad(_glyph(ch), ((0, 0), (0, 1))) for ch in text] or [np.zeros((GLYPH_H, 1), bool)]
    return np.kron(np.concatenate(cells, axis=1), np.ones((scale, scale), dtype=bool)).astype(bool)


def image_to_rgb(image: np.ndarray, levels: int, scale: int) -> np.ndarray:
    """`[h, w]` grey levels in [0, levels) (−1 = not a pixel) → `[h·scale, w·scale, 3]` uint8, ink dark."""
    image = np.asarray(image)
    grey = (255 - np.clip(image, 0, levels - 1) * 255 // (levels - 1)).astype(np.uint8)
    rgb = np.repeat(grey[..., None], 3, axis=-1)
    rgb[image < 0] = (220, 30, 30)
    return np.kron(rgb, np.ones((scale, scale, 1), dtype=np.uint8))


def render_grid(rows: Sequence[tuple[str, Sequence[np.ndarray]]], levels: int, *,
                column_titles: Sequence[str] | None = None, scale: int = 8, gap: int = 4,
                font_scale: int = 2) -> np.ndarray:
    """One labelled row of images per `(label, images)`; returns `[H, W, 3]` uint8 (white background)."""
    if not rows or not all(len(images) for _, images in rows):
        raise ValueError("rows must be a non-empty list of (label, non-empty list of images)")
    cell_h, cell_w = (np.asarray(rows[0][1][0]).shape[0] * scale, np.asarray(rows[0][1][0]).shape[1] * scale)
    label_w = max(text_mask(label, font_scale).shape[1] for label, _ in rows) + 2 * gap
    n_cols = max(len(images) for _, images in rows)
    header_h = GLYPH_H * font_scale + 2 * gap if column_titles else gap
    height = header_h + len(rows) * (cell_h + gap) + gap
    width = label_w + n_cols * (cell_w + gap) + gap
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)

    def stamp(mask: np.ndarray, top: int, left: int) -> None:
        canvas[top : top + mask.shape[0], left : left + mask.shape[1]][mask] = (0, 0, 0)

    for c, title in enumerate(column_titles or []):
        mask = text_mask(title, font_scale)
        stamp(mask, gap, label_w + c * (cell_w + gap) + (cell_w - mask.shape[1]) // 2)
    for r, (label, images) in enumerate(rows):
        top = header_h + r * (cell_h + gap)
        mask = text_mask(label, font_scale)
        stamp(mask, top + (cell_h - mask.shape[0]) // 2, gap)
        for c, image in enumerate(images):
            left = label_w + c * (cell_w + gap)
            canvas[top : top + cell_h, left : left + cell_w] = image_to_rgb(image, levels, scale)
            canvas[top : top + cell_h, left - 1][:] = 160  # thin frame: blank digits stay visible
            canvas[top : top + cell_h, left + cell_w][:] = 160
            canvas[top - 1, left : left + cell_w][:] = 160
            canvas[top + cell_h, left : left + cell_w][:] = 160
    return canvas


def write_png(path: str | os.PathLike, rgb: np.ndarray) -> Path:
    """Write `[H, W, 3]` uint8 as an 8-bit RGB PNG (no filtering, zlib level 9)."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"rgb must be [H, W, 3] uint8, got shape {rgb.shape}")
    height, width, _ = rgb.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(height))  # filter type 0 per scanline
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path
