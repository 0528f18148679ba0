# Fails when an include points the wrong way between vflow's modules (DESIGN.md §7):
#   apps -> job -> engine -> {vnode, comm, hetero, data, models} -> core,
# data and models build on vnode's seeds and slices, and the scheduler reaches jobs only
# through the job module's control-plane client.
#   cmake -DSOURCE_DIR=<tree> [-DSTAMP=<file>] -P check_layering.cmake
# Checks src/<module>/, include/vflow/<module>/ and models/; apps, tests, benchmarks and
# examples may include anything.
cmake_policy(VERSION 3.18)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_layering.cmake: SOURCE_DIR is not set")
endif()

set(_modules core vnode comm hetero data models engine job scheduler)
set(_allowed_core core)
set(_allowed_vnode core vnode)
set(_allowed_comm core comm)
set(_allowed_hetero core hetero)
set(_allowed_data core vnode data)
set(_allowed_models core vnode models)
set(_allowed_engine core vnode comm hetero data models engine)
set(_allowed_job core vnode comm hetero data models engine job)
set(_allowed_scheduler core scheduler)
# Single headers a module's named files may include from a module it may not otherwise
# reach: the scheduler's live mode (its own library) drives jobs through their control
# planes and counts the node agents' slots; the rest of the scheduler is free of LibTorch
# and of the job module.
set(_allowed_files_scheduler "vflow/job/control_plane.h" "vflow/job/agent.h")
set(_allowed_includers_scheduler "live.cpp" "live.h")

set(_violations "")
foreach(_module ${_modules})
  if(_module STREQUAL "models")
    set(_dirs "${SOURCE_DIR}/models" "${SOURCE_DIR}/include/vflow/models")
  else()
    set(_dirs "${SOURCE_DIR}/src/${_module}" "${SOURCE_DIR}/include/vflow/${_module}")
  endif()
  set(_files "")
  foreach(_dir ${_dirs})
    if(IS_DIRECTORY "${_dir}")
      file(GLOB_RECURSE _found "${_dir}/*.h" "${_dir}/*.cpp" "${_dir}/*.cu")
      list(APPEND _files ${_found})
    endif()
  endforeach()
  foreach(_file ${_files})
    file(STRINGS "${_file}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
    foreach(_line ${_lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" _path
                           "${_line}")
      file(RELATIVE_PATH _shown "${SOURCE_DIR}" "${_file}")
      get_filename_component(_includer "${_file}" NAME)
      # A relative path could reach any module unseen, and the umbrella header reaches all.
      if(_path MATCHES "(^|/)\\.\\./" OR _path STREQUAL "vflow/vflow.h")
        string(APPEND _violations "\n  ${_shown}: includes ${_path} (only apps, tests and "
                                  "examples may include the umbrella or climb directories)")
        continue()
      endif()
      string(REGEX REPLACE "^vflow/" "" _rest "${_path}")
      string(REGEX MATCH "^[a-z_]+/" _target "${_rest}")
      string(REGEX REPLACE "/$" "" _target "${_target}")
      if(NOT _target OR NOT _target IN_LIST _modules)
        continue()  # a system header, or one of the module's own relative headers
      endif()
      if(_target IN_LIST _allowed_${_module})
        continue()
      endif()
      if(_path IN_LIST _allowed_files_${_module} AND _includer IN_LIST
         _allowed_includers_${_module})
        continue()
      endif()
      string(APPEND _violations "\n  ${_shown}: includes ${_path} (${_module} -> ${_target})")
    endforeach()
  endforeach()
endforeach()

if(_violations)
  message(FATAL_ERROR
    "vflow: includes against the module layering (DESIGN.md §7; docs/design.md):"
    "${_violations}")
endif()
if(STAMP)
  file(WRITE "${STAMP}" "layering checked\n")
endif()
