"""``IngestWriter``: an ingest run's records into the store, through the drainer's own write
(``AuditStore.write_many``), chained like live ones.

One run is one writer: ``writer_id`` is a fresh UUID 4 (two runs at once never share a chain),
its records are numbered 1, 2, ... after its chain head as they are stored, in one transaction
with the insert (``write_many(append=True)``), so a record already stored (the same flow
ingested before: same id) is skipped without leaving a hole in the chain. A signed checkpoint
(``observer.store.checkpoint``) follows every ``checkpoint_every`` chained records and the end of
the run (``close``), as the drainer signs its writer's, so ``observer verify`` checks the run's
chain to its end.

Failure policy, batch by batch (``batch_max`` records): a batch whose insert meets an id stored
meanwhile by another writer (``IntegrityError``) is written again once (the id is then found and
skipped); a batch the database refuses for one of its values is written record by record, and a
refused record is counted with its error (``refused``; the capture still holds it); a database
that is unavailable raises (``UNAVAILABLE_ERRORS``): what was committed stays, and ingesting the
file again stores the rest.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone

from sqlalchemy import exc as sa_exc

from observer.records import Exchange
from observer.store.checkpoint import ZERO_HASH, CheckpointKey, make_checkpoint, note_hash
from observer.store.drain import UNAVAILABLE_ERRORS
from observer.store.store import AuditStore

log = logging.getLogger("observer.ingest")
#: What ``write_many`` raises for records the database (or its driver) cannot store.
_REFUSALS = (sa_exc.SQLAlchemyError, OverflowError, UnicodeEncodeError)


class IngestWriter:
    """Buffers records (``add``), stores them a batch at a time (``flush``), checkpoints the
    chain; ``close`` stores the rest and signs the last checkpoint. ``key``: the checkpoint key
    (``None``: no checkpoints; ``observer verify`` then warns that the writer has none).
    Counters: ``stored``, ``duplicates`` (ids already stored), ``refused`` (record id, error
    class name), ``checkpoints``."""

    def __init__(
        self,
        store: AuditStore,
        key: CheckpointKey | None,
        *,
        batch_max: int = 500,
        checkpoint_every: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if batch_max < 1 or checkpoint_every < 1:
            raise ValueError("need batch_max >= 1 and checkpoint_every >= 1")
        self.writer_id = str(uuid.uuid4())
        self._store = store
        self._key = key
        self._batch_max = batch_max
        self._checkpoint_every = checkpoint_every
        self._clock = clock
        self._pending: list[Exchange] = []
        self._last_checkpoint: dict | None = None
        self._store_id: str | None = None
        self.stored = 0
        self.duplicates = 0
        self.refused: list[tuple[str, str]] = []
        self.checkpoints = 0

    def add(self, record: Exchange) -> None:
        """Queues ``record``; a full batch is stored now (errors: ``flush``)."""
        self._pending.append(record)
        if len(self._pending) >= self._batch_max:
            self.flush()

    def flush(self) -> None:
        """Stores what is queued, then signs a checkpoint when one is due. Raises the database's
        error when it is unavailable (``UNAVAILABLE_ERRORS``)."""
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self._write(batch)
        except UNAVAILABLE_ERRORS:
            raise
        except _REFUSALS:
            for record in batch:  # one of them cannot be stored: find which
                try:
                    self._write([record])
                except UNAVAILABLE_ERRORS:
                    raise
                except _REFUSALS as exc:
                    self.refused.append((record.id, type(exc).__name__))
                    log.error("ingest: record %s cannot be stored (%s)", record.id, type(exc).__name__)
        self._checkpoint(force=False)

    def _write(self, batch: list[Exchange]) -> None:
        for attempt in (1, 2):
            try:
                duplicates = self._store.write_many(batch, writer_id=self.writer_id, append=True)
            except sa_exc.IntegrityError:
                if attempt == 2:
                    raise
                continue  # an id stored meanwhile by another writer: found and skipped now
            unique = len({r.id for r in batch})
            self.duplicates += duplicates + len(batch) - unique  # (a repeat within the batch: stored once)
            self.stored += unique - duplicates
            return

    def close(self) -> None:
        """Stores the rest and signs a checkpoint of the chain's head (when it grew)."""
        self.flush()
        self._checkpoint(force=True)

    def _checkpoint(self, *, force: bool) -> None:
        if self._key is None:
            return
        seq, head = self._store.chain_head(self.writer_id)
        last = self._last_checkpoint
        last_seq = 0 if last is None else last["seq"]
        if seq == last_seq or (not force and seq - last_seq < self._checkpoint_every):
            return
        if self._store_id is None:
            self._store_id = self._store.store_id()
        number = 1 if last is None else last["number"] + 1
        prev = ZERO_HASH if last is None else note_hash(last["note"])
        at = datetime.fromtimestamp(self._clock(), timezone.utc)
        row = make_checkpoint(
            self._key, self._store_id, self.writer_id, number, seq, head.hex(), at, prev, self._store.events_head()
        )
        self._store.add_checkpoint(row)
        self._last_checkpoint = row
        self.checkpoints += 1


__all__ = ["IngestWriter"]
