"""specdec bench: drafters and peers side by side (Spec-Bench protocol)."""
