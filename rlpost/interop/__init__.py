"""Reading other frameworks' launch scripts into rlpost configs (slime)."""
