"""Bridges to other toolkits: fairseq checkpoints, dictionaries and BPE, in and out."""
