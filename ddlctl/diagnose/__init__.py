"""Text and stacks -> facts: TensorFlow's messages, root causes in a log, missing imports, known noise, where
a stack dump stood. Pure functions, standard library only."""
