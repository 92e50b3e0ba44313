// Package apicheck holds the test that keeps eipoibd's public Go API
// closed: no exported identifier of a package outside internal/ may
// mention a type that an importer outside the module cannot name
// (docs/architecture.md, "What is public").
package apicheck
