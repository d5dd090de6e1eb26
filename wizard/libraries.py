"""One lock around importing the heavy libraries (torch, transformers, peft, accelerate, DeepSpeed).

Why: a front end imports accelerate and DeepSpeed in a background thread (validation's preload) while the
main thread sizes a model, and transformers' modeling modules import accelerate too. Two threads inside
accelerate's own import cycle (accelerate.utils -> bnb -> big_modeling -> hooks -> accelerate.utils) meet as a
"partially initialized module" ImportError in one of them. Whoever imports these libraries for the first
time holds this lock; later holders find them in sys.modules and pass at once.
"""

from __future__ import annotations

import threading

IMPORT_LOCK = threading.RLock()
