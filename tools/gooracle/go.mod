module kproxy.local/gooracle

go 1.26.0
