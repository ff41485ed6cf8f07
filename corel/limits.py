"""Bounds the library holds its inputs to, in a module that imports nothing: the service's
settings take their defaults from here at every start, and a process that only reads its
settings (``corel worker`` before it becomes Celery's worker) does not import torch for them
(``corel.data``'s package does)."""

MAX_PIXELS = 40_000_000
"""The most pixels an image may declare before it is decoded (a 40-megapixel photo): a small
file can declare far more (a PNG of 20,000 x 20,000 pixels fits in 400 KB), and decoding it
would take gigabytes."""
