"""An open watch of the API server: its events, one per line of the answer (ERROR events
raised as the typed errors of `corepin.kube.errors`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from corepin.core.errors import ApiUnreachable
from corepin.kube.errors import api_error
from corepin.kube.models import ObjectView
from corepin.kube.transport import Stream


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED or BOOKMARK (ERROR events are raised)."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        return ObjectView(self.object).resource_version


class Watch:
    """An open watch: iterate for events; ends when the server ends it (timeout). Raises
    ApiGone on a 410 ERROR event, ApiError for other ERROR events, ApiUnreachable when the
    connection is cut. `close()` (from any thread via the Cancel token) stops it."""

    def __init__(self, stream: Stream, target: str) -> None:
        self._stream = stream
        self._target = target

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for line in self._stream.lines():
                try:
                    event = json.loads(line)
                    kind = str(event["type"])
                    obj = event["object"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise ApiUnreachable(self._target, f"malformed watch event: {exc}") from exc
                if kind == "ERROR":
                    raise api_error(
                        int(obj.get("code") or 500), obj, verb="watch", target=self._target
                    )
                yield WatchEvent(kind, obj)
        finally:
            self.close()

    def close(self) -> None:
        self._stream.close()
