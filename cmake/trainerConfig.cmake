# Package configuration of the installed trainer SDK. A plugin project:
#   find_package(trainer REQUIRED)
#   trainer_add_plugin(my_logger KIND logger NAME mine SOURCES Mine.cpp)
# Targets: trainer::core (the SDK library), trainer::trainer (the executable).
include(CMakeFindDependencyMacro)
find_dependency(Torch)
find_dependency(Boost 1.74)
include("${CMAKE_CURRENT_LIST_DIR}/trainerTargets.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/TrainerPlugin.cmake")
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
