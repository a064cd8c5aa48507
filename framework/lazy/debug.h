// The engine side of loom/debug.h: the executor reports compiles, reads and steps here.
#pragma once

#include "ir/graph.h"

#include <loom/debug.h>

#include <source_location>
#include <string>

namespace loom::debug {

std::string site_of(const std::source_location& loc);
// An uncached compile of `g` at `site`; returns the cause it recorded.
std::string note_compile(const ir::Graph& g, const std::string& site);
void note_transfer(const std::string& site);
void note_step();
// Set while step closures run: their reads are expected and not counted.
void set_in_closure(bool on);
bool in_closure();

}  // namespace loom::debug
