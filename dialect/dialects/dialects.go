// Package dialects is the table of every API dialect the gateway speaks to backends: adding
// an API is one line here. The table is immutable: each call builds a new Registry.
package dialects

import (
	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/anthropic"
	"github.com/oncegate/oncegate/dialect/azure"
	"github.com/oncegate/oncegate/dialect/bedrock"
	"github.com/oncegate/oncegate/dialect/gemini"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/dialect/responses"
)

// All returns every dialect.
func All() []dialect.Dialect {
	return []dialect.Dialect{
		openai.New(),
		anthropic.New(),
		responses.New(),
		gemini.New(),
		azure.New(),
		bedrock.New(),
	}
}

// Registry is the registry of All.
func Registry() *dialect.Registry {
	r, err := dialect.NewRegistry(All()...)
	if err != nil {
		panic(err) // the table above is wrong: a test catches it
	}
	return r
}
