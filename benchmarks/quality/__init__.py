"""Translation quality: BLEU in a CPU time budget, optimizer recipes, the demo corpus's recipes, numbers copied."""
