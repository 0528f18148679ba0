// Precompiled header: the heavy LibTorch includes shared by every vflow translation unit.
#pragma once
#include <torch/torch.h>
