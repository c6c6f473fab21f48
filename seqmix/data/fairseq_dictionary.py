"""fairseq's ``dict.<lang>.txt`` vocabularies, read and written with fairseq's exact ids.

A released fairseq model's embedding rows are indexed by these ids, so the mapping must match fairseq's loader
to the line: the four specials ``<s> <pad> </s> <unk>`` take ids 0-3 and are not in the file; line ``i``
(0-based) gets id ``4 + i``; a line is ``<token> <count>`` split at the last space, optionally followed by
`` #fairseq:overwrite``, which lets a token repeat (the repeat gets a new id and becomes the one
:meth:`FairseqDictionary.index` returns, as in fairseq). ``madeupwordNNNN 0`` lines (fairseq pads the vocabulary
to a multiple of 8 with them) are ordinary entries: dropping them would shift no id but would break the
row count of the embedding.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from seqmix.errors import SeqmixError
from seqmix.files import atomic_write_text

SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
OVERWRITE_FLAG = "#fairseq:overwrite"
_EOL = "\r\n"


class FairseqDictionary:
    """Token <-> id table equal to fairseq's ``Dictionary`` loaded from the same file.

    ``symbols`` are the entries after the four specials (the file's tokens, in order); ``counts`` their counts
    (default 1, what fairseq's ``add_symbol`` uses); ``overwrite`` marks entries that carry the
    ``#fairseq:overwrite`` flag, the only way a token may appear twice.
    """

    nspecial = len(SPECIAL_SYMBOLS)
    bos, pad, eos, unk = 0, 1, 2, 3

    def __init__(self, symbols: list[str], counts: list[int] | None = None, *,
                 overwrite: list[bool] | None = None):
        symbols = list(symbols)
        counts = [1] * len(symbols) if counts is None else [int(c) for c in counts]
        overwrite = [False] * len(symbols) if overwrite is None else [bool(f) for f in overwrite]
        if len(counts) != len(symbols) or len(overwrite) != len(symbols):
            raise SeqmixError(f"FairseqDictionary got {len(symbols)} symbols but {len(counts)} counts and "
                              f"{len(overwrite)} overwrite flags; pass one of each per symbol")
        self.symbols: list[str] = list(SPECIAL_SYMBOLS)
        self.counts: list[int] = [1] * self.nspecial
        self._overwrite: list[bool] = [False] * self.nspecial
        self._indices: dict[str, int] = {s: i for i, s in enumerate(SPECIAL_SYMBOLS)}
        for symbol, count, flag in zip(symbols, counts, overwrite):
            if not isinstance(symbol, str) or "\n" in symbol or "\r" in symbol:
                raise SeqmixError(f"FairseqDictionary symbol {symbol!r} is not a one-line string; "
                                  "remove it (a dict.txt file holds one token per line)")
            if symbol in self._indices and not flag:
                raise SeqmixError(f"FairseqDictionary symbol {symbol!r} appears twice (or repeats a special "
                                  "symbol); remove the duplicate or mark it with overwrite=True")
            self._add(symbol, count, flag)

    def _add(self, symbol: str, count: int, flag: bool) -> None:
        self._indices[symbol] = len(self.symbols)
        self.symbols.append(symbol)
        self.counts.append(count)
        self._overwrite.append(flag)

    # -- lookups ---------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.symbols)

    def __getitem__(self, idx: int) -> str:
        return self.symbols[idx]

    def __iter__(self) -> Iterator[str]:
        return iter(self.symbols)

    def __contains__(self, token: str) -> bool:
        return token in self._indices

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FairseqDictionary):
            return NotImplemented
        return self.symbols == other.symbols

    __hash__ = None  # mutable-content equality, like list

    def __repr__(self) -> str:
        return f"FairseqDictionary({len(self)} symbols)"

    def index(self, token: str) -> int:
        """The id fairseq gives ``token`` (the last overwrite wins); the unk id 3 when it is not in the table."""
        return self._indices.get(token, self.unk)

    # -- files -----------------------------------------------------------------------------------------------

    def to_lines(self) -> list[str]:
        """The ``dict.txt`` lines (no newlines), specials excluded, flags kept, so a loaded file saves back
        byte for byte."""
        return [f"{s} {c}" + (f" {OVERWRITE_FLAG}" if flag else "")
                for s, c, flag in zip(self.symbols[self.nspecial:], self.counts[self.nspecial:],
                                      self._overwrite[self.nspecial:])]

    def save(self, path: str | os.PathLike) -> None:
        """Write ``dict.txt`` atomically (a reader sees the old file or the whole new one)."""
        atomic_write_text(Path(path), "".join(line + "\n" for line in self.to_lines()))

    @classmethod
    def from_lines(cls, lines: Iterable[str], name: str = "<memory>") -> FairseqDictionary:
        """Parse ``dict.txt`` lines exactly as fairseq's ``Dictionary.add_from_file`` does; ``name`` is what
        error messages call the source."""
        symbols, counts, flags = [], [], []
        seen: dict[str, int] = {}
        for lineno, raw in enumerate(lines, start=1):
            line = raw.rstrip()
            parts = line.rsplit(" ", 1)
            flag = False
            if len(parts) == 2 and parts[1] == OVERWRITE_FLAG:
                flag = True
                parts = parts[0].rsplit(" ", 1)
            try:
                if len(parts) != 2:
                    raise ValueError
                token, count = parts[0], int(parts[1])
            except ValueError:
                raise SeqmixError(f"fairseq dictionary {name}, line {lineno}, is not '<token> <count>' "
                                  f"(optionally followed by ' {OVERWRITE_FLAG}'): got {raw.rstrip(_EOL)!r}; "
                                  "fix or remove that line") from None
            if not flag and (token in seen or token in SPECIAL_SYMBOLS):
                where = (f"line {seen[token]}" if token in seen else "a built-in special symbol")
                raise SeqmixError(f"fairseq dictionary {name}, line {lineno}: token {token!r} repeats {where} "
                                  f"without the '{OVERWRITE_FLAG}' flag; remove the duplicate line or append "
                                  "the flag to it")
            seen.setdefault(token, lineno)
            symbols.append(token)
            counts.append(count)
            flags.append(flag)
        return cls(symbols, counts, overwrite=flags)

    @classmethod
    def load(cls, path: str | os.PathLike) -> FairseqDictionary:
        """Read a fairseq ``dict.<lang>.txt`` (UTF-8; line endings as Python text mode reads them, like fairseq)."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SeqmixError(f"fairseq dictionary {path} does not exist; pass the dict.<lang>.txt that was "
                              "released or preprocessed with the model") from None
        except OSError as e:
            raise SeqmixError(f"cannot read fairseq dictionary {path} ({e}); check the path") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            lineno = data[: e.start].count(b"\n") + 1
            raise SeqmixError(f"fairseq dictionary {path}, line {lineno}, is not valid UTF-8; re-encode the file "
                              "as UTF-8") from None
        return cls.from_lines(io.StringIO(text, newline=None), name=str(path))
