"""What runs inside a training process: the zygote that forks tasks, the ``tf.distribute.Server`` entry
point, the task's TensorFlow environment, step and FLOP recording, the stack dumper, the device
measurement, and the model.fit instrumentation."""
