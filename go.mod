module github.com/tessera-gpu/tessera

go 1.26

require (
	github.com/google/go-cmp v0.7.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)
