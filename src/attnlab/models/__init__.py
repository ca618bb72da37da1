"""Loading pretrained transformers and capturing their attention maps."""
