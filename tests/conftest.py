pytest_plugins = ["kproxy.testing.pytest_plugin"]
