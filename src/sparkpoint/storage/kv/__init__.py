"""Key-value stores: byte-level engines and the typed store users see."""
