"""An Input that applies every key in the order it was typed.

Textual's Input inserts a printable character in its own key handler, but its editing keys (backspace, delete,
arrows, ctrl+u, ...) are bindings, and a key reaches a binding only after bubbling from the Input up to the
app. Keys typed in a burst (a fast typist, a paste of keys, tmux send-keys) are all queued at the Input first,
so the characters were inserted before the editing keys between them ran: "16" then BSpace 7 BSpace 8 gave
"16" ("167", "1678", then both deletions), not "18" (Textual issue #6605; the fix proposed there, PR #6631, runs
the widget's own bindings inline, as this does). The focused widget is the first namespace of the binding chain
and priority bindings (ctrl+q, ctrl+c here) were checked before the key reached it, so the same action runs
as before, only in order.
"""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class TypedInput(Input):
    async def _on_key(self, event: events.Key) -> None:
        if not event.is_printable:
            # key_to_bindings: Textual's BindingsMap (8.x); without it the key takes Textual's own way
            for binding in getattr(self._bindings, "key_to_bindings", {}).get(event.key, ()):
                if not binding.priority and await self.app.run_action(binding.action, self):
                    event.stop()
                    event.prevent_default()
                    return
        await super()._on_key(event)
