"""Request traces: loaders (Bailian, Mooncake), an agentic trace generator, and trace statistics."""
