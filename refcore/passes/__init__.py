"""Graph passes on torch models (GraphModule -> GraphModule); see README.md in this folder."""
