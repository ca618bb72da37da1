"""Loading transformers models and capturing their attention maps (encoders, decoders and
encoder-decoders), with their tokenizers' words."""
