"""Lab fixtures (real LXC containers on pure cgroup v2, a real sshd on 127.0.0.1)."""
