"""`mmap_files_closed`: the files a store test opens are closed after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def mmap_files_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every `MmapFileList` a test opens is closed after it: a store a unit test leaves open holds
    a descriptor per file (test_mmap_store.py alone left ~550 open in its xdist worker, the
    store-model test ~400). For tests whose stores live no longer than the test."""
    from dledger.store.file_list import MmapFileList

    opened: list[MmapFileList] = []
    init = MmapFileList.__init__

    def tracked(self: MmapFileList, *args: object, **kw: object) -> None:
        init(self, *args, **kw)  # type: ignore[arg-type]
        opened.append(self)

    monkeypatch.setattr(MmapFileList, "__init__", tracked)
    yield
    for file_list in opened:
        file_list.close()
