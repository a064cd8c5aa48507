#include <loom/optim.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <numbers>

namespace loom::optim {

void Schedule::step() {
  ++step_;
  opt_.set_lr(lr_at(step_));
}

void Schedule::set_step(int64_t step) {
  if (step < 0) throw Error("schedule: expected a step >= 0, got " + std::to_string(step));
  step_ = step;
  opt_.set_lr(lr_at(step_));
}

namespace {

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

}  // namespace

StepSchedule::StepSchedule(Optimizer& opt, StepOptions o) : Schedule(opt), o_(o) {
  if (o_.step_size <= 0) throw Error("StepSchedule: expected step_size > 0, got " + std::to_string(o_.step_size));
  if (!(o_.gamma > 0 && o_.gamma <= 1)) throw Error("StepSchedule: expected gamma in (0, 1], got " + number(o_.gamma));
  if (o_.warmup_steps < 0)
    throw Error("StepSchedule: expected warmup_steps >= 0, got " + std::to_string(o_.warmup_steps));
  opt_.set_lr(lr_at(0));
}

double StepSchedule::lr_at(int64_t step) const {
  const double warm = step < o_.warmup_steps ? static_cast<double>(step + 1) / static_cast<double>(o_.warmup_steps) : 1.0;
  return o_.base_lr * warm * std::pow(o_.gamma, static_cast<double>(step / o_.step_size));
}

CosineSchedule::CosineSchedule(Optimizer& opt, CosineOptions o) : Schedule(opt), o_(o) {
  if (o_.warmup_steps < 0 || o_.total_steps <= o_.warmup_steps)
    throw Error("CosineSchedule: expected 0 <= warmup_steps < total_steps, got " +
                std::to_string(o_.warmup_steps) + " and " + std::to_string(o_.total_steps));
  if (!(o_.min_lr >= 0 && o_.min_lr <= o_.base_lr))
    throw Error("CosineSchedule: expected 0 <= min_lr <= base_lr, got " + number(o_.min_lr) + " and " +
                number(o_.base_lr));
  opt_.set_lr(lr_at(0));
}

double CosineSchedule::lr_at(int64_t step) const {
  if (step < o_.warmup_steps) return o_.base_lr * static_cast<double>(step + 1) / static_cast<double>(o_.warmup_steps);
  double progress = static_cast<double>(step - o_.warmup_steps) / static_cast<double>(o_.total_steps - o_.warmup_steps);
  progress = std::min(progress, 1.0);
  return o_.min_lr + 0.5 * (o_.base_lr - o_.min_lr) * (1 + std::cos(std::numbers::pi * progress));
}

WarmupSchedule::WarmupSchedule(Optimizer& opt, WarmupOptions o) : Schedule(opt), o_(o) {
  if (o_.warmup_steps <= 0) throw Error("WarmupSchedule: expected warmup_steps > 0, got " + std::to_string(o_.warmup_steps));
  opt_.set_lr(lr_at(0));
}

double WarmupSchedule::lr_at(int64_t step) const {
  return o_.base_lr * std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(o_.warmup_steps));
}

}  // namespace loom::optim
